//! The memory plan of a wgpu stage: device bytes for the weights (uploaded once), the KV state and
//! its snapshot, and the work buffers; checked against the device's memory before anything is
//! uploaded.
use ds4_model::kv::{compressed_capacity, compressor_rows};
use ds4_model::{LayerRange, Stage, Weights};

use crate::error::WgpuError;
use crate::gpu::Gpu;

use super::work::{logit_rows, moe_floats, sizes};

/// Device bytes of a stage, by kind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PlanBytes {
    pub weights: u64,
    pub kv: u64,
    pub work: u64,
}

impl PlanBytes {
    pub fn total(&self) -> u64 {
        self.weights + self.kv + self.work
    }
}

/// The plan of layers `part` of `stage` at `ctx` / `nmax`.
pub fn plan(stage: &Stage, ctx: usize, nmax: usize, part: LayerRange) -> PlanBytes {
    let (cfg, w) = (&stage.cfg, &stage.w);
    let nmax = nmax.max(1);
    // The bytes of the part's tensors, as the CPU stage maps them (the stage binds without error, so its
    // parts do too).
    let weights = Weights::map_plan(&w.file, cfg, part).map_or(0, |p| p.bytes());
    let mut kv = 0usize;
    for il in part.first..=part.last {
        let lw = w.layer(il);
        let ratio = cfg.ratio(il);
        let cap = compressed_capacity(ctx, ratio);
        // Ring, its snapshot and checkpoint; compressed / indexer rows; frontiers (kv + score), their
        // snapshot and checkpoint.
        kv += 3 * cfg.swa * cfg.head_dim;
        if ratio != 0 {
            let front = |d: usize| 6 * compressor_rows(ratio) * cfg.compress_coff(il) * d;
            kv += cap * cfg.head_dim + front(cfg.head_dim);
            if lw.indexer.is_some() {
                kv += cap * cfg.idx_dim + front(cfg.idx_dim);
            }
        }
    }
    // The logits rows as a device with a 2 GiB binding limit keeps them (the most any adapter keeps).
    let rows = logit_rows(cfg, nmax, (2u64 << 30) - 1);
    let work: usize = sizes(cfg, nmax, ctx, rows).iter().map(|(_, n)| n).sum::<usize>() + moe_floats(cfg, nmax) + cfg.n_vocab;
    PlanBytes { weights, kv: kv as u64 * 4, work: work as u64 * 4 }
}

/// Device bytes the stage of `part` needs (see [`plan`]): the memory plan's GPU line.
pub fn plan_bytes(stage: &Stage, ctx: usize, nmax: usize, part: LayerRange) -> u64 {
    plan(stage, ctx, nmax, part).total()
}

/// Refuses a plan larger than the device's memory (where the device reports it).
pub(super) fn check_fits(gpu: &Gpu, p: &PlanBytes) -> Result<(), WgpuError> {
    match gpu.memory_bytes() {
        Some(have) if p.total() > have => Err(WgpuError::OutOfMemory {
            adapter: gpu.caps().adapter.clone(),
            need: p.total(),
            have,
            detail: format!("weights {:.2} GiB, KV {:.2} GiB, work buffers {:.2} GiB", gib(p.weights), gib(p.kv), gib(p.work)),
        }),
        _ => Ok(()),
    }
}

fn gib(b: u64) -> f64 {
    b as f64 / (1u64 << 30) as f64
}
