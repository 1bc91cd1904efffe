//! The memory plan (design §5): one function sizes resident weights, KV state, buffers, prefill working
//! memory and logits for a config, layer range, context and prefill chunk. Allocation uses the same
//! formulas (`kv_bytes` ↔ `KvState::new`, `WorkSizes` ↔ `Stage::reserve`), so the plan cannot drift.
use crate::config::Config;
use crate::kv::{kv_bytes, KvBytes};
use crate::stage::WorkSizes;
use crate::weights::LayerRange;

const GIB: f64 = (1u64 << 30) as f64;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryPlan {
    pub weights: u64,
    pub kv: KvBytes,
    /// Decode-sized work buffers and per-thread scratch.
    pub buffers: u64,
    /// Extra working memory of a prefill chunk over decode.
    pub prefill: u64,
    pub logits: u64,
    pub ctx: usize,
    pub prefill_chunk: usize,
}

impl MemoryPlan {
    pub fn new(cfg: &Config, range: LayerRange, weights: u64, ctx: usize, prefill_chunk: usize, threads: usize) -> Self {
        let rows = range.head as usize;
        let decode = WorkSizes::new(cfg, 1, ctx, 0).bytes(threads);
        let chunk = WorkSizes::new(cfg, prefill_chunk.max(1), ctx, 0).bytes(threads);
        Self {
            weights,
            kv: kv_bytes(cfg, range, ctx),
            buffers: decode,
            prefill: chunk.saturating_sub(decode),
            logits: (rows * cfg.n_vocab * 4) as u64,
            ctx,
            prefill_chunk,
        }
    }

    pub fn total(&self) -> u64 {
        self.weights + self.kv.total() + self.buffers + self.prefill + self.logits
    }

    /// `memory: weights A GiB + KV B GiB + buffers C GiB + prefill D GiB = T GiB planned (budget E GiB)`
    pub fn describe(&self, budget: u64) -> String {
        format!(
            "memory: weights {:.2} GiB + KV {:.2} GiB + buffers {:.2} GiB + prefill {:.2} GiB = {:.2} GiB planned (budget {:.2} GiB)",
            self.weights as f64 / GIB,
            self.kv.total() as f64 / GIB,
            (self.buffers + self.logits) as f64 / GIB,
            self.prefill as f64 / GIB,
            self.total() as f64 / GIB,
            budget as f64 / GIB
        )
    }

    /// Refuses a plan over `budget`, naming the largest parts and the remedies.
    pub fn check(&self, budget: u64) -> Result<(), String> {
        if self.total() <= budget {
            return Ok(());
        }
        let mut parts = [
            ("weights", self.weights),
            ("KV cache", self.kv.total()),
            ("prefill working memory", self.prefill),
            ("buffers", self.buffers + self.logits),
        ];
        parts.sort_by(|a, b| b.1.cmp(&a.1));
        Err(format!(
            "memory plan {:.2} GiB exceeds the budget of {:.2} GiB (largest: {} {:.2} GiB, {} {:.2} GiB); \
             use a smaller --ctx (now {}) or --prefill-chunk (now {}), serve fewer layers with --layers, or raise --mem-limit-gb",
            self.total() as f64 / GIB,
            budget as f64 / GIB,
            parts[0].0,
            parts[0].1 as f64 / GIB,
            parts[1].0,
            parts[1].1 as f64 / GIB,
            self.ctx,
            self.prefill_chunk
        ))
    }
}

/// Memory this machine can give the process now (`MemAvailable`), if known.
pub fn available_ram() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = s.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}
