//! The MTP drafter on a wgpu device: `ds4_gpu::GpuMtp` over [`WgpuMtpOps`], the MTP block built as a
//! one-layer stage (`WgpuOps`) on the main stage's device, with the MTP head as its head (its own
//! `hc_head_*` and `norm`, the main stage's resident output matrix: shared, not copied) and the block's
//! input ops. Everything is built once; a draft step writes its pairs (embedding rows, hidden rows or
//! an on-device copy of the block's own output row) and records the same ops as any step.
use std::sync::Arc;

use ds4_gpu::{GpuMtp, MtpOps, PairHidden, Step};
use ds4_model::weights::MtpHeadWeights;
use ds4_model::{Config, LayerRange, ModelError, Stage, Weights};

use super::device_ops::err;
use super::head::{HeadOps, HeadParts};
use super::layer::upload;
use super::work::{hc_dims, Work};
use super::{ge, we, WgpuOps, WgpuStage};
use crate::buffer::GpuBuffer;
use crate::encoder::Encoder;
use crate::error::WgpuError;
use crate::gpu::{Gpu, Step as GpuStep};
use crate::ops::{HcPost, RmsNorm, StepMatVec};
use crate::resident::ResidentTensor;

/// The drafter on a wgpu device.
pub type WgpuMtp = GpuMtp<WgpuMtpOps>;

/// The block's ops and its input ops (see the module doc).
pub struct WgpuMtpOps {
    block: WgpuOps,
    io: Inputs,
}

/// The block's input from the step's pairs:
/// X_s = e_proj · rmsw(emb, enorm) + h_proj · rmsw(H_s, hnorm).
struct Inputs {
    /// The pairs' embedding rows (nmax x n_embd), normed in place.
    emb: GpuBuffer,
    /// The pairs' hidden rows (nmax x n_hc x n_embd), normed in place per stream.
    hin: GpuBuffer,
    /// e_proj of the normed embedding rows (nmax x n_embd; bound by `e_proj` and `add`).
    _ep: GpuBuffer,
    enorm: RmsNorm,
    e_proj: StepMatVec,
    hnorm: RmsNorm,
    /// h_proj on every stream at once: a grouped product over h_proj stacked n_hc times, writing the
    /// block's streams.
    h_proj: StepMatVec,
    /// X_s += ep for every stream: the HC exit with post 1 and the identity as comb (1 · ep + X_s,
    /// exact in the added zeros), so no kernel of its own.
    add: HcPost,
    _w: [ResidentTensor; 2],
    _consts: [GpuBuffer; 3],
}

impl Inputs {
    fn new(gpu: &Gpu, cfg: &Config, w: &Weights, hw: &MtpHeadWeights, work: &Work, nmax: usize) -> Result<Self, WgpuError> {
        let (e, hd, nh, eps) = (cfg.n_embd, cfg.hc_dim(), cfg.n_hc, cfg.rms_eps);
        let m = u32::try_from(nmax).map_err(|_| WgpuError::BadShape { what: "MTP drafter".into(), reason: format!("{nmax} pairs a step") })?;
        let dims = hc_dims(cfg);
        let emb = GpuBuffer::new(gpu, "mtp embedding rows", nmax * e)?;
        let hin = GpuBuffer::new(gpu, "mtp hidden rows", nmax * hd)?;
        let ep = GpuBuffer::new(gpu, "mtp e_proj rows", nmax * e)?;
        let enw = GpuBuffer::from_slice(gpu, "mtp.enorm", &hw.enorm)?;
        let hnw = GpuBuffer::from_slice(gpu, "mtp.hnorm", &hw.hnorm)?;
        let cl = dims.coef_len();
        let mut coef = vec![0f32; nmax * cl];
        for c in coef.chunks_exact_mut(cl) {
            for s in 0..nh {
                c[s] = 1.0;
                c[nh + s * nh + s] = 1.0;
            }
        }
        let coef = GpuBuffer::from_slice(gpu, "mtp identity exit", &coef)?;
        let ew = upload(gpu, w, &hw.e_proj, "mtp.e_proj")?;
        let hpw = upload(gpu, w, &hw.h_proj, "mtp.h_proj")?;
        let stacked = hpw.stacked(nh);
        Ok(Self {
            enorm: RmsNorm::new(gpu, &emb, e, Some(&enw), eps, m)?,
            e_proj: StepMatVec::new(gpu, &ew, &emb, &ep, m)?,
            hnorm: RmsNorm::per_token(gpu, &hin, e, nh, Some(&hnw), eps, m)?,
            h_proj: StepMatVec::grouped(gpu, &stacked, &hin, &work.x, m, e, hd)?,
            add: HcPost::new(gpu, &dims, &work.x, &ep, &coef, m)?,
            emb,
            hin,
            _ep: ep,
            _w: [ew, hpw],
            _consts: [enw, hnw, coef],
        })
    }

    fn encode(&self, enc: &mut Encoder) -> Result<(), WgpuError> {
        self.enorm.encode(enc)?;
        self.e_proj.encode(enc)?;
        self.hnorm.encode(enc)?;
        self.h_proj.encode(enc)?;
        self.add.encode(enc)
    }
}

impl MtpOps for WgpuMtpOps {
    type Block = WgpuOps;

    fn block(&self) -> &WgpuOps {
        &self.block
    }

    fn block_mut(&mut self) -> &mut WgpuOps {
        &mut self.block
    }

    fn load_pairs(&mut self, emb: &[f32], hidden: PairHidden<'_>) -> ds4_gpu::Result<()> {
        let gpu = &self.block.gpu;
        let hd = self.block.cfg.hc_dim();
        self.io.emb.write(gpu, emb).map_err(err)?;
        match hidden {
            PairHidden::Host(h) => self.io.hin.write(gpu, h).map_err(err),
            PairHidden::Own { row } => {
                let x = &self.block.work.x;
                if (row + 1) * hd > x.len() {
                    return Err(format!("wgpu: MTP output row {row} is outside the streams").into());
                }
                // Submitted now: in queue order before the step that reads it.
                let mut enc = Encoder::new(gpu, GpuStep::default());
                enc.copy_at(&x.buffer, (row * hd * 4) as u64, &self.io.hin.buffer, 0, (hd * 4) as u64);
                gpu.submit(enc).map_err(err)
            }
        }
    }

    fn inputs(&mut self, _step: Step) -> ds4_gpu::Result<()> {
        let io = &self.io;
        let enc = self.block.enc()?;
        io.encode(enc).map_err(err)?;
        enc.mark("mtp_inputs");
        Ok(())
    }
}

impl WgpuMtpOps {
    /// The device's counters (tests check that a draft step creates nothing).
    pub fn gpu(&self) -> &Gpu {
        &self.block.gpu
    }
}

impl WgpuStage {
    /// The MTP drafter of `mtp` (`ds4_model::mtp::Mtp::stage`: the MTP file bound as the block of the
    /// main model's `block_config`) on this stage's device, with steps of up to `nmax` pairs and a window
    /// cache for `ctx` positions. It reads this stage's output matrix (the stage must have the head).
    pub fn mtp_drafter(&self, mtp: &Stage, nmax: usize, ctx: usize) -> Result<WgpuMtp, ModelError> {
        let main = &self.0.ops;
        let head = main.head.as_ref().ok_or_else(|| ModelError::Invalid("wgpu: MTP drafting needs the output head on this stage".into()))?;
        let hw = mtp.w.mtp.as_ref().ok_or_else(|| ModelError::Invalid("wgpu: the MTP drafter needs the MTP file's weights".into()))?;
        let cfg = mtp.cfg.clone();
        let il = cfg.n_layer.checked_sub(1).ok_or_else(|| ModelError::Invalid("wgpu: the MTP block config has no layer".into()))?;
        let nmax = nmax.max(1);
        let part = LayerRange { first: il, last: il, embed: false, head: false };
        let gpu: Arc<Gpu> = main.gpu.clone();
        let mut block = WgpuOps::build(gpu.clone(), mtp, ctx, nmax, part, 1).map_err(we)?;
        let mut build = || -> Result<Inputs, WgpuError> {
            let hc_fn = upload(&gpu, &mtp.w, &hw.hc_fn, "mtp.hc_head_fn")?;
            let parts = HeadParts { hc_fn, scale: hw.hc_scale[0], base: &hw.hc_base, norm: &hw.norm, output: head.output().share() };
            block.head = Some(HeadOps::with(&gpu, &cfg, parts, &block.work, nmax as u32)?);
            let io = Inputs::new(&gpu, &cfg, &mtp.w, hw, &block.work, nmax)?;
            gpu.wait()?;
            Ok(io)
        };
        let io = build().map_err(we)?;
        GpuMtp::new(cfg, WgpuMtpOps { block, io }, nmax, ctx).map_err(ge)
    }
}
