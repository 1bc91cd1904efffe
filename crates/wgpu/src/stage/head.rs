//! The stage's ends: the token embedding (first stage) and the output head (last stage): HC collapse
//! and norm of every row or the last one, the vocabulary product, the device greedy pick.
use ds4_model::{Config, Weights};

use crate::error::WgpuError;
use crate::gpu::Gpu;
use crate::ops::{Argmax, Embed, HcHead, HeadRows, MatVec, Product, StepMatVec};
use crate::resident::ResidentTensor;
use crate::Encoder;

use super::layer::upload;
use super::work::{hc_dims, Work};

pub(crate) struct EmbedOps {
    pub op: Embed,
    pub rows: usize,
    _table: ResidentTensor,
}

impl EmbedOps {
    pub fn new(gpu: &Gpu, cfg: &Config, w: &Weights, wk: &Work, nmax: u32) -> Result<Option<Self>, WgpuError> {
        let Some(m) = &w.embed else { return Ok(None) };
        let table = upload(gpu, w, m, "token_embd")?;
        let op = Embed::new(gpu, &table, &wk.tokens, &wk.x, cfg.n_hc, nmax)?;
        Ok(Some(Self { op, rows: table.rows, _table: table }))
    }
}

pub(crate) struct HeadOps {
    all: HcHead,
    last: HcHead,
    /// Logits of every row (`all`) or of the last row (`last`, one product).
    logits_all: StepMatVec,
    logits_last: MatVec,
    pub argmax: Argmax,
    _w: [ResidentTensor; 2],
}

/// The tensors of a head: HC collapse (`hc_fn`, `scale`, `base`), output norm, output matrix.
pub(crate) struct HeadParts<'a> {
    pub hc_fn: ResidentTensor,
    pub scale: f32,
    pub base: &'a [f32],
    pub norm: &'a [f32],
    pub output: ResidentTensor,
}

/// Which rows the head normalised in this step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HeadPick {
    All,
    Last,
}

impl HeadOps {
    pub fn new(gpu: &Gpu, cfg: &Config, w: &Weights, wk: &Work, nmax: u32) -> Result<Option<Self>, WgpuError> {
        let Some(hw) = &w.head else { return Ok(None) };
        let hfn = upload(gpu, w, &hw.hc_fn, "output_hc_fn")?;
        let out = upload(gpu, w, &hw.output, "output")?;
        let p = HeadParts { hc_fn: hfn, scale: hw.hc_scale[0], base: &hw.hc_base, norm: &hw.norm, output: out };
        Ok(Some(Self::with(gpu, cfg, p, wk, nmax)?))
    }

    /// A head over the given tensors (the MTP drafter's: its own collapse and norm, the main model's
    /// output matrix).
    pub fn with(gpu: &Gpu, cfg: &Config, p: HeadParts, wk: &Work, nmax: u32) -> Result<Self, WgpuError> {
        let dims = hc_dims(cfg);
        let HeadParts { hc_fn: hfn, scale, base, norm, output: out } = p;
        let head = |rows| HcHead::new(gpu, &dims, &hfn, scale, base, norm, &wk.x, &wk.mix, &wk.head, rows, nmax);
        let (all, last) = (head(HeadRows::All)?, head(HeadRows::Last)?);
        // Every row's logits only as far as the logits buffer holds rows (checked per step).
        let logits_all = StepMatVec::new(gpu, &out, &wk.head, &wk.logits, wk.logit_rows as u32)?;
        let logits_last = MatVec::new(gpu, &out, &wk.head, &wk.logits, Product::Vec)?;
        let argmax = Argmax::new(gpu, &wk.logits, cfg.n_vocab)?;
        Ok(Self { all, last, logits_all, logits_last, argmax, _w: [hfn, out] })
    }

    /// The output matrix (vocabulary x n_embd), resident.
    pub fn output(&self) -> &ResidentTensor {
        &self._w[1]
    }

    pub fn norm(&self, enc: &mut Encoder, pick: HeadPick) -> Result<(), WgpuError> {
        match pick {
            HeadPick::All => self.all.encode(enc),
            HeadPick::Last => self.last.encode(enc),
        }
    }

    pub fn logits(&self, enc: &mut Encoder, pick: HeadPick) -> Result<(), WgpuError> {
        match pick {
            HeadPick::All => self.logits_all.encode(enc),
            HeadPick::Last => self.logits_last.encode(enc),
        }
    }
}
