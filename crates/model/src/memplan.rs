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
    /// Weights only mapped from the file to be uploaded to an accelerator: page cache, reclaimable,
    /// not counted against the host budget (0 for a CPU plan).
    pub mapped: u64,
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
            mapped: 0,
            kv: kv_bytes(cfg, range, ctx),
            buffers: decode,
            prefill: chunk.saturating_sub(decode),
            logits: (rows * cfg.n_vocab * 4) as u64,
            ctx,
            prefill_chunk,
        }
    }

    /// Host plan when the weights are resident on an accelerator: the file is mapped only to upload
    /// from it and the CPU work buffers are not allocated; the host keeps the KV state and the logits.
    pub fn for_accelerator(cfg: &Config, range: LayerRange, weights: u64, ctx: usize, prefill_chunk: usize) -> Self {
        Self {
            weights: 0,
            mapped: weights,
            kv: kv_bytes(cfg, range, ctx),
            buffers: 0,
            prefill: 0,
            logits: (range.head as usize * cfg.n_vocab * 4) as u64,
            ctx,
            prefill_chunk,
        }
    }

    pub fn total(&self) -> u64 {
        self.weights + self.kv.total() + self.buffers + self.prefill + self.logits
    }

    /// `memory: weights A GiB + KV B GiB + buffers C GiB + prefill D GiB = T GiB planned (budget E GiB)`
    pub fn describe(&self, budget: u64) -> String {
        let mapped = if self.mapped > 0 { format!(" (+ {:.2} GiB of weights mapped for the GPU upload: page cache, not counted)", self.mapped as f64 / GIB) } else { String::new() };
        format!(
            "memory: weights {:.2} GiB + KV {:.2} GiB + buffers {:.2} GiB + prefill {:.2} GiB = {:.2} GiB planned (budget {:.2} GiB){mapped}",
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

#[cfg(test)]
mod tests {
    use super::*;

    fn tiny() -> Config { crate::synth::shape("tiny").unwrap() }

    #[test]
    fn accelerator_plan_counts_no_host_weights_or_cpu_buffers() {
        let cfg = tiny();
        let range = LayerRange::full(&cfg);
        let cpu = MemoryPlan::new(&cfg, range, 1 << 30, 4096, 256, 2);
        let gpu = MemoryPlan::for_accelerator(&cfg, range, 1 << 30, 4096, 256);
        assert_eq!(gpu.weights, 0);
        assert_eq!(gpu.mapped, 1 << 30);
        assert_eq!(gpu.kv, cpu.kv);
        assert_eq!(gpu.logits, cpu.logits);
        assert_eq!(gpu.total(), cpu.total() - cpu.weights - cpu.buffers - cpu.prefill);
        assert!(gpu.describe(u64::MAX).contains("mapped for the GPU upload"));
        assert!(!cpu.describe(u64::MAX).contains("mapped"));
        // A budget below the host weights still admits the accelerator plan.
        assert!(cpu.check(1 << 29).is_err());
        assert!(gpu.check(1 << 29).is_ok());
    }
}
