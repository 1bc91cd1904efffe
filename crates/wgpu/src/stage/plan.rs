//! The memory plan of a wgpu stage: device bytes for the weights (uploaded once), the KV state of
//! every KV slot with its snapshot (and one checkpoint), and the work buffers; checked against the
//! device's memory before anything is uploaded.
use ds4_model::kv::{compressed_capacity, compressor_rows};
use ds4_model::{LayerRange, Stage, Weights};

use crate::error::WgpuError;
use crate::gpu::Gpu;

use super::work::{logit_rows, moe_floats, sizes, split_len};
use crate::gpu::MAX_BATCH_ROWS;

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

/// The plan of layers `part` of `stage` at `ctx` / `nmax`, one KV slot.
pub fn plan(stage: &Stage, ctx: usize, nmax: usize, part: LayerRange) -> PlanBytes {
    plan_slots(stage, ctx, nmax, part, 1)
}

/// The plan of layers `part` of `stage` at `ctx` / `nmax` with `slots` KV slots (sessions resident
/// at once).
pub fn plan_slots(stage: &Stage, ctx: usize, nmax: usize, part: LayerRange, slots: usize) -> PlanBytes {
    let (cfg, w) = (&stage.cfg, &stage.w);
    let nmax = nmax.max(1);
    let slots = slots.max(1);
    // The bytes of the part's tensors, as the CPU stage maps them (the stage binds without error, so its
    // parts do too).
    let weights = Weights::map_plan(&w.file, cfg, part).map_or(0, |p| p.bytes());
    let mut kv = 0usize;
    for il in part.first..=part.last {
        let lw = w.layer(il);
        let ratio = cfg.ratio(il);
        let cap = compressed_capacity(ctx, ratio);
        // Per slot: ring and its snapshot, compressed / indexer rows, frontiers (kv + score) and their
        // snapshot; one checkpoint (ring, frontiers) of slot 0; each compressor's undo rows (kv + gate
        // projections of a verify step's rows).
        let (per_slot, ckpt) = (2 * slots + 1, 2 * (2 * slots + 1));
        kv += per_slot * cfg.swa * cfg.head_dim;
        if ratio != 0 {
            let undo = 2 * crate::ops::UNDO_ROWS.min(nmax);
            let front = |d: usize| (ckpt * compressor_rows(ratio) + undo) * cfg.compress_coff(il) * d;
            kv += slots * cap * cfg.head_dim + front(cfg.head_dim);
            if lw.indexer.is_some() {
                kv += slots * cap * cfg.idx_dim + front(cfg.idx_dim);
            }
        }
    }
    // The logits rows as a device with a 2 GiB binding limit keeps them (the most any adapter keeps).
    let rows = logit_rows(cfg, nmax, (2u64 << 30) - 1);
    let splits = split_len(cfg, w, part, ctx, nmax, slots);
    let work: usize = sizes(cfg, nmax, ctx, rows, splits).iter().map(|(_, n)| n).sum::<usize>() + moe_floats(cfg, nmax) + cfg.n_vocab;
    PlanBytes { weights, kv: kv as u64 * 4, work: work as u64 * 4 }
}

/// Device bytes of the MTP drafter of `mtp` (`ds4_model::mtp::Mtp::stage`) with steps of `nmax` pairs
/// at `ctx` (`WgpuStage::mtp_drafter`): the MTP weights, the block's window cache (ring, snapshot,
/// checkpoint), its work buffers and the pair inputs. The output matrix is the main stage's (shared,
/// not counted again).
pub fn plan_mtp(mtp: &Stage, ctx: usize, nmax: usize) -> PlanBytes {
    let cfg = &mtp.cfg;
    let nmax = nmax.max(1);
    let il = cfg.n_layer.saturating_sub(1);
    let part = LayerRange { first: il, last: il, embed: false, head: false };
    let kv = 3 * cfg.swa * cfg.head_dim;
    let rows = logit_rows(cfg, nmax, (2u64 << 30) - 1);
    let splits = split_len(cfg, &mtp.w, part, ctx, nmax, 1);
    let inputs = nmax * (2 * cfg.n_embd + cfg.hc_dim() + cfg.n_hc + cfg.n_hc * cfg.n_hc);
    let work: usize = sizes(cfg, nmax, ctx, rows, splits).iter().map(|(_, n)| n).sum::<usize>() + moe_floats(cfg, nmax) + cfg.n_vocab + inputs;
    PlanBytes { weights: mtp.w.resident_bytes(), kv: kv as u64 * 4, work: work as u64 * 4 }
}

/// Device bytes the stage of `part` needs (see [`plan`]): the memory plan's GPU line.
pub fn plan_bytes(stage: &Stage, ctx: usize, nmax: usize, part: LayerRange) -> u64 {
    plan(stage, ctx, nmax, part).total()
}

/// Refuses a plan larger than the device's memory (where the device reports it).
/// `reserve`: bytes a second stage on the device will take (the MTP drafter).
pub(super) fn check_fits(gpu: &Gpu, p: &PlanBytes, slots: usize, reserve: u64) -> Result<(), WgpuError> {
    let need = p.total().saturating_add(reserve);
    match gpu.memory_bytes() {
        Some(have) if need > have => {
            let also = if reserve > 0 { format!(", MTP drafter {:.2} GiB", gib(reserve)) } else { String::new() };
            Err(WgpuError::OutOfMemory {
                adapter: gpu.caps().adapter.clone(),
                need,
                have,
                detail: format!("weights {:.2} GiB, KV {:.2} GiB ({slots} KV slot(s)), work buffers {:.2} GiB{also}", gib(p.weights), gib(p.kv), gib(p.work)),
            })
        }
        _ => Ok(()),
    }
}

/// The KV slot count a stage is built with (0 means 1), refused over what a batched step holds: the
/// step uniform's rows, and the `nmax` activation rows of the work buffers.
pub(super) fn check_slots(slots: usize, nmax: usize) -> Result<usize, WgpuError> {
    if slots > MAX_BATCH_ROWS {
        return Err(WgpuError::BadShape { what: "KV slots".into(), reason: format!("{slots} sessions; a batched step holds at most {MAX_BATCH_ROWS}") });
    }
    if slots > nmax.max(1) {
        return Err(WgpuError::BadShape { what: "KV slots".into(), reason: format!("a batched step of {slots} sessions needs {slots} activation rows; the buffers hold {nmax} (--prefill-chunk): raise it or batch fewer sessions") });
    }
    Ok(slots.max(1))
}

fn gib(b: u64) -> f64 {
    b as f64 / (1u64 << 30) as f64
}
