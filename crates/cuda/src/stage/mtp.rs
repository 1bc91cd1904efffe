//! The MTP drafter on CUDA: `ds4_gpu::GpuMtp` over [`CudaMtpOps`], the MTP block built as a one-layer
//! `CudaOps` on the main stage's GPU, with the MTP head installed as its head (its own `hc_head_*` and
//! `norm`, the main stage's output matrix read where it lies: same device, same primary context) and
//! the block's input ops from the existing kernels (`rms_rows`, the mat-vecs, `hc_post`). Everything is
//! allocated at build; a draft step copies its pairs in (embedding rows, hidden rows or a device copy
//! of the block's own output row) on the block's stream, ahead of the step.
use super::*;
use ds4_gpu::{GpuMtp, MtpOps, PairHidden};
use ds4_model::weights::Mat;

/// The drafter on CUDA.
pub type CudaMtp = GpuMtp<CudaMtpOps>;

/// Pairs a CUDA draft step takes: one. The block's prefill-sized buffers (`CudaOps::build` with more
/// than one row reserves a quarter of the free memory as prefill expert scratch) are not worth it for
/// steps of a few pairs; one-pair steps are decode steps, replayed as CUDA graphs, and runs longer
/// than the window are cut to it (`GpuMtp::forward`).
pub const CUDA_MTP_STEP_PAIRS: usize = 1;

/// The block's ops and its input ops (see the module doc). Device buffers first: dropped (with the
/// context bound, `Drop`) before the block's own, whose `Gpu` goes last.
pub struct CudaMtpOps {
    /// The pairs' embedding rows (nmax x n_embd) and hidden rows (nmax x hd), normed in place.
    emb: DBuf,
    hin: DBuf,
    /// e_proj of the normed embedding rows.
    ep: DBuf,
    /// Post 1, comb identity for every row: `hc_post` then adds ep to every stream (1 · ep + X_s).
    coef: DBuf,
    /// The ring at the journal's start (window-only block: the ring is all its mutable state).
    ckpt: DBuf,
    e_proj: DM,
    h_proj: DM,
    enorm: u64,
    hnorm: u64,
    nmax: usize,
    _bufs: Vec<DBuf>,
    block: CudaOps,
}

impl Drop for CudaMtpOps {
    fn drop(&mut self) {
        // The buffers above are freed before the block's drop binds its context: bind it now.
        let _ = self.block.g.bind();
    }
}

/// A device copy of `v`.
fn upload_f32(g: &Gpu, bufs: &mut Vec<DBuf>, v: &[f32]) -> Result<u64> {
    let b = g.alloc(v.len() * 4)?;
    g.htod(b.ptr, v)?;
    WEIGHT_UPLOADS.fetch_add(1, Ordering::Relaxed);
    let p = b.ptr;
    bufs.push(b);
    Ok(p)
}

/// A device copy of matrix `m` of `w`, in the file's row layout.
fn upload_mat(g: &Gpu, bufs: &mut Vec<DBuf>, w: &ds4_model::Weights, m: &Mat) -> Result<DM> {
    let r = w.mat(m);
    let row_bytes = m.ty.row_bytes(m.cols).ok_or_else(|| format!("MTP matrix of {} columns is not whole {} blocks", m.cols, m.ty.name()))?;
    let b = g.alloc(r.data.len())?;
    g.htod(b.ptr, r.data)?;
    WEIGHT_UPLOADS.fetch_add(1, Ordering::Relaxed);
    let dm = DM { ptr: b.ptr, ty: m.ty, rows: m.rows, cols: m.cols, n_mat: 1, row_bytes, split: false };
    bufs.push(b);
    Ok(dm)
}

impl CudaMtpOps {
    fn build(main: &CudaOps, mtp: &Stage, ctx: usize, nmax: usize) -> Result<Self> {
        let output = main.head.as_ref().ok_or("MTP drafting needs the output head on this stage")?.output;
        let hw = mtp.w.mtp.as_ref().ok_or("the MTP drafter needs the MTP file's weights")?;
        let cfg = &mtp.cfg;
        let il = cfg.n_layer.checked_sub(1).ok_or("the MTP block config has no layer")?;
        let part = LayerRange { first: il, last: il, embed: false, head: false };
        let mut block = CudaOps::build(mtp, ctx, ChunkFit::fixed(nmax), part, main.g.ctx.ordinal(), main.weight_place, 1)?;
        let (e, hd, nh) = (cfg.n_embd, cfg.hc_dim(), cfg.n_hc);
        let g = &block.g;
        let mut bufs = Vec::new();
        let head = DHead {
            hc_fn: upload_mat(g, &mut bufs, &mtp.w, &hw.hc_fn)?,
            hc_scale: upload_f32(g, &mut bufs, &hw.hc_scale)?,
            hc_base: upload_f32(g, &mut bufs, &hw.hc_base)?,
            norm: upload_f32(g, &mut bufs, &hw.norm)?,
            output,
        };
        let e_proj = upload_mat(g, &mut bufs, &mtp.w, &hw.e_proj)?;
        let h_proj = upload_mat(g, &mut bufs, &mtp.w, &hw.h_proj)?;
        let enorm = upload_f32(g, &mut bufs, &hw.enorm)?;
        let hnorm = upload_f32(g, &mut bufs, &hw.hnorm)?;
        let cl = nh + nh * nh;
        let mut id = vec![0f32; nmax * cl];
        for c in id.chunks_exact_mut(cl) {
            for s in 0..nh {
                c[s] = 1.0;
                c[nh + s * nh + s] = 1.0;
            }
        }
        let coef = g.alloc(id.len() * 4)?;
        g.htod(coef.ptr, &id)?;
        let ring = block.kv.first().ok_or("the MTP block has no KV state")?.ring.bytes;
        let (emb, hin, ep, ckpt) = (g.alloc(nmax * e * 4)?, g.alloc(nmax * hd * 4)?, g.alloc(nmax * e * 4)?, g.alloc_zeroed(ring)?);
        g.sync()?;
        block.head = Some(head);
        Ok(Self { emb, hin, ep, coef, ckpt, e_proj, h_proj, enorm, hnorm, nmax, _bufs: bufs, block })
    }
}

impl CudaMtpOps {
    /// Device bytes of the drafter: the block's plan (weights, KV, work) and the buffers added here.
    pub fn device_bytes(&self) -> u64 {
        let own: usize = [&self.emb, &self.hin, &self.ep, &self.coef, &self.ckpt].iter().map(|b| b.bytes).sum::<usize>() + self._bufs.iter().map(|b| b.bytes).sum::<usize>();
        self.block.gpu_plan.total() + own as u64
    }
}

impl MtpOps for CudaMtpOps {
    type Block = CudaOps;

    fn block(&self) -> &CudaOps { &self.block }

    fn block_mut(&mut self) -> &mut CudaOps { &mut self.block }

    fn load_pairs(&mut self, emb: &[f32], hidden: PairHidden<'_>) -> ds4_gpu::Result<()> {
        let (e, hd) = (self.block.cfg.n_embd, self.block.cfg.hc_dim());
        if emb.len() > self.nmax * e || !emb.len().is_multiple_of(e) {
            return Err(format!("cuda: {} MTP embedding floats for steps of {} pairs of {e}", emb.len(), self.nmax).into());
        }
        let g = &self.block.g;
        g.htod(self.emb.ptr, emb)?;
        match hidden {
            PairHidden::Host(h) if h.len() == emb.len() / e * hd => Ok(g.htod(self.hin.ptr, h)?),
            PairHidden::Host(h) => Err(format!("cuda: {} MTP hidden floats for {} pairs", h.len(), emb.len() / e).into()),
            PairHidden::Own { row } if row < self.nmax => Ok(g.dtod(self.hin.ptr, self.block.wk.x.ptr + (row * hd * 4) as u64, hd * 4)?),
            PairHidden::Own { row } => Err(format!("cuda: MTP output row {row} is outside the streams").into()),
        }
    }

    fn inputs(&mut self, step: Step) -> ds4_gpu::Result<()> {
        let n = step.n;
        let (e, nh) = (self.block.cfg.n_embd, self.block.cfg.n_hc);
        let (emb, hin, ep, x) = (self.emb.ptr, self.hin.ptr, self.ep.ptr, self.block.wk.x.ptr);
        let b = &mut self.block;
        b.rms(emb, e, emb, e, e, self.enorm, n)?;
        b.mm(&self.e_proj, emb, n, ep)?;
        // Every stream's row on its own: n x n_hc rows of n_embd.
        b.rms(hin, e, hin, e, e, self.hnorm, n * nh)?;
        b.mm(&self.h_proj, hin, n * nh, x)?;
        let args = [A::P(self.coef.ptr), A::I(nh as i32), A::P(ep), A::P(x), A::I(e as i32)];
        Ok(b.g.launch("hc_post", (cdiv(e, 256), n as u32, 1), 256, 0, &args)?)
    }

    fn can_checkpoint(&self) -> bool { true }

    fn checkpoint(&mut self, restore: bool) -> ds4_gpu::Result<()> {
        let ring = self.block.kv.first().ok_or("cuda: the MTP block has no KV state")?;
        let (live, saved, bytes) = (ring.ring.ptr, self.ckpt.ptr, ring.ring.bytes.min(self.ckpt.bytes));
        let (dst, src) = if restore { (live, saved) } else { (saved, live) };
        Ok(self.block.g.dtod(dst, src, bytes)?)
    }
}

impl CudaStage {
    /// The MTP drafter of `mtp` (`ds4_model::mtp::Mtp::stage`: the MTP file bound as the block of the
    /// main model's `block_config`) on this stage's GPU, with a window cache for `ctx` positions. It
    /// reads this stage's output matrix: the stage must have the head and outlive the drafter.
    pub fn mtp_drafter(&self, mtp: &Stage, ctx: usize) -> ds4_model::Result<CudaMtp> {
        let ops = CudaMtpOps::build(&self.0.ops, mtp, ctx, CUDA_MTP_STEP_PAIRS).map_err(me)?;
        GpuMtp::new(mtp.cfg.clone(), ops, CUDA_MTP_STEP_PAIRS, ctx).map_err(ge)
    }
}
