//! The activation and work buffers of a step, allocated once at load for up to `nmax` tokens and
//! shared by every layer (each layer's ops run one after another, so one set serves all of them).
use ds4_model::kv::compressed_capacity;
use ds4_model::{Config, LayerRange, Weights};

use crate::buffer::GpuBuffer;
use crate::error::WgpuError;
use crate::gpu::Gpu;
use crate::ops::{max_candidates, split_floats, HcDims, MoeScratch};

pub(crate) struct Work {
    /// Token ids of the step (u32).
    pub tokens: GpuBuffer,
    /// The HC streams (nmax x n_hc x n_embd).
    pub x: GpuBuffer,
    /// Scratch of the HC mix projection (also the head's).
    pub mix: GpuBuffer,
    /// The normalised sub-layer input.
    pub xn: GpuBuffer,
    /// Exit coefficients of the current sub-layer.
    pub coef: GpuBuffer,
    pub qr: GpuBuffer,
    pub q: GpuBuffer,
    pub kv: GpuBuffer,
    /// Compressor projections (kv, gate): rows of up to 2 x head_dim.
    pub ck: GpuBuffer,
    pub cg: GpuBuffer,
    /// The indexer compressor's projections.
    pub ik: GpuBuffer,
    pub ig: GpuBuffer,
    pub iq: GpuBuffer,
    pub iw: GpuBuffer,
    /// Indexer scores (nmax x the ratio-4 capacity) and picks (nmax x top_k).
    pub scores: GpuBuffer,
    pub sel: GpuBuffer,
    /// Attention output, its grouped low-rank projection, the sub-layer output.
    pub o: GpuBuffer,
    pub low: GpuBuffer,
    pub y: GpuBuffer,
    /// Router logits, expert ids and weights.
    pub rlog: GpuBuffer,
    pub ids: GpuBuffer,
    pub wts: GpuBuffer,
    pub moe: MoeScratch,
    /// The head: normalised rows and their logits (`logit_rows` rows).
    pub head: GpuBuffer,
    pub logits: GpuBuffer,
    /// The attention split partials every layer shares (they run one after another).
    pub splits: GpuBuffer,
    pub logit_rows: usize,
}

/// Floats of the attention split partials of the layers `part` at `ctx`: steps of up to `nmax` tokens
/// and batched steps of up to `slots` rows.
pub(crate) fn split_len(cfg: &Config, w: &Weights, part: LayerRange, ctx: usize, nmax: usize, slots: usize) -> usize {
    let cand = |il: usize| {
        let lw = w.layer(il);
        let ratio = if lw.comp.is_some() { cfg.ratio(il) } else { 0 };
        let top_k = if ratio != 0 && lw.indexer.is_some() { cfg.idx_topk } else { 0 };
        max_candidates(cfg.swa, ratio, top_k, compressed_capacity(ctx, ratio))
    };
    let max_cand = (part.first..=part.last).map(cand).max().unwrap_or(cfg.swa);
    split_floats(cfg.n_head, cfg.head_dim, max_cand, nmax, slots).max(1)
}

/// True when each work buffer of `nmax`-token steps (and the MoE scratch's largest) fits one binding of
/// `gpu`: what `Work::new` would otherwise refuse. `splits` as in [`sizes`].
pub(crate) fn fits_bindings(gpu: &Gpu, cfg: &Config, nmax: usize, ctx: usize, splits: usize) -> bool {
    let limit = gpu.caps().max_binding;
    let rows = logit_rows(cfg, nmax, limit);
    let moe = nmax * cfg.n_expert_used * cfg.ff_exp.max(cfg.n_embd);
    sizes(cfg, nmax, ctx, rows, splits).iter().map(|&(_, n)| n).chain([moe]).all(|n| 4 * n as u64 <= limit)
}

/// Rows of logits a stage keeps: every token of a step, unless a binding cannot hold them (then a
/// step asking for more rows is refused with the numbers).
pub(crate) fn logit_rows(cfg: &Config, nmax: usize, max_binding: u64) -> usize {
    let per = cfg.n_vocab as u64 * 4;
    (max_binding / per).clamp(1, nmax as u64) as usize
}

/// The floats of each work buffer (name, count), in the order `Work::new` allocates them: the
/// memory plan sums them. `splits`: floats of the attention split partials (`split_len`).
pub(crate) fn sizes(cfg: &Config, nmax: usize, ctx: usize, logit_rows: usize, splits: usize) -> Vec<(&'static str, usize)> {
    let (m, d, e) = (nmax, cfg.head_dim, cfg.n_embd);
    let (ih, id) = (cfg.idx_heads, cfg.idx_dim);
    let dims = hc_dims(cfg);
    let cap4 = compressed_capacity(ctx, 4);
    vec![
        ("tokens", m),
        ("streams", m * cfg.hc_dim()),
        ("hc mix", m * dims.n_mix().max(cfg.n_hc)),
        ("xn", m * e),
        ("hc coef", m * dims.coef_len()),
        ("q lora", m * cfg.q_lora),
        ("q", m * cfg.q_dim()),
        ("kv", m * d),
        ("compressor kv", m * 2 * d),
        ("compressor gate", m * 2 * d),
        ("indexer compressor kv", m * 2 * id),
        ("indexer compressor gate", m * 2 * id),
        ("indexer q", m * ih * id),
        ("indexer weights", m * ih),
        ("indexer scores", m * cap4.max(1)),
        ("indexer picks", m * cfg.idx_topk.max(1)),
        ("attention out", m * cfg.q_dim()),
        ("attention low rank", m * cfg.o_groups * cfg.o_lora),
        ("sub-layer out", m * e),
        ("router logits", m * cfg.n_expert),
        ("expert ids", m * cfg.n_expert_used),
        ("expert weights", m * cfg.n_expert_used),
        ("head rows", m * e),
        ("logits", logit_rows * cfg.n_vocab),
        ("attention splits", splits),
    ]
}

/// Floats of the MoE scratch (`MoeScratch::new`): routed a/b per slot, their output, the shared expert's.
pub(crate) fn moe_floats(cfg: &Config, nmax: usize) -> usize {
    let (k, ff, e) = (cfg.n_expert_used, cfg.ff_exp, cfg.n_embd);
    nmax * (2 * k * ff + k * e + 2 * ff + e)
}

pub(crate) fn hc_dims(cfg: &Config) -> HcDims {
    HcDims { n_hc: cfg.n_hc, n_embd: cfg.n_embd, sinkhorn_iters: cfg.sinkhorn_iters, hc_eps: cfg.hc_eps, rms_eps: cfg.rms_eps }
}

impl Work {
    pub fn new(gpu: &Gpu, cfg: &Config, nmax: usize, ctx: usize, splits: usize) -> Result<Self, WgpuError> {
        let logit_rows = logit_rows(cfg, nmax, gpu.caps().max_binding);
        // A work buffer over one binding is the prefill chunk's (or the context's) doing: say so.
        let sized = |e: WgpuError| match e {
            WgpuError::BindingOverLimit { what, bytes, limit } => WgpuError::BadShape {
                what,
                reason: format!("{bytes} bytes for {nmax}-token steps at --ctx {ctx} exceed one binding of this adapter ({limit} bytes): use a smaller --prefill-chunk (or --ctx)"),
            },
            e => e,
        };
        let mut b = sizes(cfg, nmax, ctx, logit_rows, splits).into_iter().map(|(name, n)| GpuBuffer::new(gpu, name, n).map_err(sized));
        let mut next = || b.next().expect("one size per buffer");
        Ok(Self {
            tokens: next()?,
            x: next()?,
            mix: next()?,
            xn: next()?,
            coef: next()?,
            qr: next()?,
            q: next()?,
            kv: next()?,
            ck: next()?,
            cg: next()?,
            ik: next()?,
            ig: next()?,
            iq: next()?,
            iw: next()?,
            scores: next()?,
            sel: next()?,
            o: next()?,
            low: next()?,
            y: next()?,
            rlog: next()?,
            ids: next()?,
            wts: next()?,
            head: next()?,
            logits: next()?,
            splits: next()?,
            moe: MoeScratch::new(gpu, cfg.n_embd, cfg.ff_exp, cfg.n_expert_used, nmax as u32).map_err(sized)?,
            logit_rows,
        })
    }
}
