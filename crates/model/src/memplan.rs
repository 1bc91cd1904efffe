//! The memory plan (design §5): one function sizes resident weights, KV state, buffers, prefill working
//! memory and logits for a config, layer range, context and prefill chunk. Allocation uses the same
//! formulas (`kv_bytes` ↔ `KvState::new`, `WorkSizes` ↔ `Stage::reserve`), so the plan cannot drift.
use crate::config::Config;
use crate::kv::{kv_bytes, KvBytes};
use crate::stage::WorkSizes;
use crate::hostload::WeightMemory;
use crate::weights::LayerRange;

const GIB: f64 = (1u64 << 30) as f64;

/// Where the forward pass runs, for the plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    Cpu,
    /// Weights and KV on an accelerator: the host keeps no work buffers.
    Accelerator,
}

/// What a plan is made from: all of it is known before a weight byte is read (the map plan's size
/// comes from the tensor directory).
#[derive(Debug, Clone, Copy)]
pub struct PlanInput<'a> {
    pub cfg: &'a Config,
    pub range: LayerRange,
    /// Bytes of the tensors the stage owns (the map plan's spans).
    pub weights: u64,
    pub ctx: usize,
    pub prefill_chunk: usize,
    pub threads: usize,
    /// KV states held at once (a session plus the server's snapshots); at least 1 is planned.
    pub kv_states: usize,
    pub memory: WeightMemory,
    pub placement: Placement,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryPlan {
    /// Host weight bytes counted against the budget: copied into memory, or mapped for the CPU to read
    /// (decode reads every page, so a mapping the RAM cannot hold would page from disk every token).
    pub weights: u64,
    pub memory: WeightMemory,
    /// Weights only mapped from the file to be uploaded to an accelerator: page cache, reclaimable,
    /// not counted against the host budget.
    pub mapped: u64,
    /// One KV state; `kv_states` of them are planned.
    pub kv: KvBytes,
    pub kv_states: usize,
    /// Decode-sized work buffers and per-thread scratch.
    pub buffers: u64,
    /// Extra working memory of a prefill chunk over decode.
    pub prefill: u64,
    pub logits: u64,
    /// What an accelerator must hold (its weights and KV state); 0 on the CPU.
    pub device: u64,
    pub ctx: usize,
    pub prefill_chunk: usize,
}

impl MemoryPlan {
    pub fn new(i: &PlanInput) -> Self {
        let (cfg, range) = (i.cfg, i.range);
        let kv = kv_bytes(cfg, range, i.ctx);
        let logits = (range.head as usize * cfg.n_vocab * 4) as u64;
        let kv_states = i.kv_states.max(1);
        match i.placement {
            Placement::Cpu => {
                let decode = WorkSizes::new(cfg, 1, i.ctx, 0).bytes(i.threads);
                let chunk = WorkSizes::new(cfg, i.prefill_chunk.max(1), i.ctx, 0).bytes(i.threads);
                Self {
                    weights: i.weights,
                    memory: i.memory,
                    mapped: 0,
                    kv,
                    kv_states,
                    buffers: decode,
                    prefill: chunk.saturating_sub(decode),
                    logits,
                    device: 0,
                    ctx: i.ctx,
                    prefill_chunk: i.prefill_chunk,
                }
            }
            // The host maps the file to upload from it (or holds a copy when asked to) and keeps the KV
            // state and the logits; the device holds the weights and its own KV state.
            Placement::Accelerator => {
                let copied = i.memory == WeightMemory::Copy;
                Self {
                    weights: if copied { i.weights } else { 0 },
                    memory: i.memory,
                    mapped: if copied { 0 } else { i.weights },
                    kv,
                    kv_states,
                    buffers: 0,
                    prefill: 0,
                    logits,
                    device: i.weights + kv.total(),
                    ctx: i.ctx,
                    prefill_chunk: i.prefill_chunk,
                }
            }
        }
    }

    /// Host bytes the plan counts against the budget.
    pub fn total(&self) -> u64 {
        self.weights + self.kv_total() + self.buffers + self.prefill + self.logits
    }

    /// All planned KV states.
    pub fn kv_total(&self) -> u64 { self.kv.total() * self.kv_states as u64 }

    /// `memory: weights A GiB + KV B GiB + buffers C GiB + prefill D GiB = T GiB planned (budget E GiB)`
    pub fn describe(&self, budget: u64) -> String {
        let how = if self.weights > 0 { format!(" ({})", self.memory.name()) } else { String::new() };
        let states = if self.kv_states > 1 { format!(" ({} states)", self.kv_states) } else { String::new() };
        let mapped = if self.mapped > 0 { format!(" (+ {:.2} GiB of weights mapped for the GPU upload: page cache, not counted)", gib(self.mapped)) } else { String::new() };
        let device = if self.device > 0 { format!("; accelerator: {:.2} GiB of weights and KV", gib(self.device)) } else { String::new() };
        format!(
            "memory: weights {:.2} GiB{how} + KV {:.2} GiB{states} + buffers {:.2} GiB + prefill {:.2} GiB = {:.2} GiB planned (budget {:.2} GiB){mapped}{device}",
            gib(self.weights),
            gib(self.kv_total()),
            gib(self.buffers + self.logits),
            gib(self.prefill),
            gib(self.total()),
            gib(budget)
        )
    }

    /// The largest parts, for messages.
    fn largest(&self) -> [(&'static str, u64); 4] {
        let mut parts = [
            ("weights", self.weights),
            ("KV cache", self.kv_total()),
            ("prefill working memory", self.prefill),
            ("buffers", self.buffers + self.logits),
        ];
        parts.sort_by(|a, b| b.1.cmp(&a.1));
        parts
    }
}

/// The plan of `input` if it fits `budget` host bytes; otherwise a refusal that gives the numbers and
/// the flag values that would fit (found by planning again with a smaller context or prefill chunk).
pub fn admit(input: &PlanInput, budget: u64) -> Result<MemoryPlan, String> {
    let plan = MemoryPlan::new(input);
    if plan.total() <= budget {
        return Ok(plan);
    }
    let fits = |ctx: usize, chunk: usize| MemoryPlan::new(&PlanInput { ctx, prefill_chunk: chunk, ..*input }).total() <= budget;
    let mut would = Vec::new();
    if let Some(c) = largest_fitting(input.ctx, |c| fits(c, input.prefill_chunk)).map(round_ctx).filter(|&c| c >= MIN_CTX) {
        would.push(format!("--ctx {c}"));
    }
    if let Some(p) = largest_fitting(input.prefill_chunk, |p| fits(input.ctx, p)).map(round_chunk) {
        would.push(format!("--prefill-chunk {p}"));
    }
    let need = (plan.total() as f64 / GIB * 10.0).ceil() / 10.0;
    would.push(format!("--mem-limit-gb {need:.1}"));
    let parts = plan.largest();
    let shrink = if would.len() == 1 {
        " a smaller --ctx or --prefill-chunk cannot make it fit (serve fewer layers with --layers);"
    } else {
        ""
    };
    Err(format!(
        "memory plan {:.2} GiB exceeds the budget of {:.2} GiB (largest: {} {:.2} GiB, {} {:.2} GiB; --ctx {}, --prefill-chunk {});{shrink} would fit: {}",
        gib(plan.total()),
        gib(budget),
        parts[0].0,
        gib(parts[0].1),
        parts[1].0,
        gib(parts[1].1),
        input.ctx,
        input.prefill_chunk,
        would.join(", or ")
    ))
}

/// Checks an accelerator plan's device part against the accelerator's free memory.
pub fn admit_device(plan: &MemoryPlan, free: u64) -> Result<(), String> {
    if plan.device <= free {
        return Ok(());
    }
    Err(format!(
        "the accelerator needs {:.2} GiB for the weights and KV state but has {:.2} GiB free: use a smaller --ctx, serve fewer layers with --layers, or spread them over more GPUs with --cuda-devices",
        gib(plan.device),
        gib(free)
    ))
}

/// Smallest context worth suggesting.
const MIN_CTX: usize = 16;

/// The largest `v` in `1..below` with `fits(v)` (`fits` is monotone: true up to some value).
fn largest_fitting(below: usize, fits: impl Fn(usize) -> bool) -> Option<usize> {
    if below <= 1 || !fits(1) {
        return None;
    }
    let (mut lo, mut hi) = (1, below - 1);
    while lo < hi {
        let mid = lo + (hi - lo).div_ceil(2);
        if fits(mid) { lo = mid } else { hi = mid - 1 }
    }
    Some(lo)
}

/// A round context to suggest: a multiple of 1024 from 2048 up, of 16 below.
fn round_ctx(c: usize) -> usize { if c >= 2048 { c / 1024 * 1024 } else { c / 16 * 16 } }

/// A round prefill chunk to suggest: a multiple of 16 from 32 up.
fn round_chunk(p: usize) -> usize { if p >= 32 { p / 16 * 16 } else { p } }

fn gib(b: u64) -> f64 { b as f64 / GIB }

/// Activation rows (the prefill chunk) a GPU stage is built for: `max`, or where the work buffers for
/// `max` rows do not fit beside the weights, the largest of max/2, max/4, ... that does, not below `min`
/// (`--prefill-chunk` not given: a GPU takes the largest chunk that fits, as the C engine's 2048-4096).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkFit {
    pub max: usize,
    pub min: usize,
    /// Device bytes to leave free beside the stage for what is placed after it (the MTP drafter) when
    /// choosing among the candidates; the last candidate is only checked as a fixed chunk is.
    pub reserve: u64,
}

/// The largest prefill chunk a GPU backend takes when `--prefill-chunk` is not given.
pub const GPU_CHUNK_MAX: usize = 4096;

impl ChunkFit {
    /// Exactly `n` rows.
    pub fn fixed(n: usize) -> Self { Self { max: n.max(1), min: n.max(1), reserve: 0 } }

    /// Up to [`GPU_CHUNK_MAX`] rows, no more than a `ctx`-token prompt can use (rounded up to a power
    /// of two), and at least `min`.
    pub fn gpu_auto(ctx: usize, min: usize) -> Self {
        let min = min.max(1);
        Self { max: GPU_CHUNK_MAX.min(ctx.max(1).next_power_of_two()).max(min), min, reserve: 0 }
    }

    /// The row counts to try, largest first: max, max/2, ... while not below `min`, then `min`.
    pub fn candidates(&self) -> Vec<usize> {
        let mut v = Vec::new();
        let mut n = self.max.max(self.min);
        while n > self.min {
            v.push(n);
            n /= 2;
        }
        v.push(self.min);
        v
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

    fn input(cfg: &Config, weights: u64, ctx: usize, placement: Placement) -> PlanInput<'_> {
        PlanInput { cfg, range: LayerRange::full(cfg), weights, ctx, prefill_chunk: 256, threads: 2, kv_states: 1, memory: WeightMemory::Copy, placement }
    }

    #[test]
    fn accelerator_plan_counts_no_host_weights_or_cpu_buffers() {
        let cfg = tiny();
        let cpu = MemoryPlan::new(&input(&cfg, 1 << 30, 4096, Placement::Cpu));
        let gpu = MemoryPlan::new(&PlanInput { memory: WeightMemory::Mmap, ..input(&cfg, 1 << 30, 4096, Placement::Accelerator) });
        assert_eq!(gpu.weights, 0);
        assert_eq!(gpu.mapped, 1 << 30);
        assert_eq!(gpu.kv, cpu.kv);
        assert_eq!(gpu.logits, cpu.logits);
        assert_eq!(gpu.device, (1 << 30) + cpu.kv.total());
        assert_eq!(cpu.device, 0);
        assert_eq!(gpu.total(), cpu.total() - cpu.weights - cpu.buffers - cpu.prefill);
        assert!(gpu.describe(u64::MAX).contains("mapped for the GPU upload"));
        assert!(!cpu.describe(u64::MAX).contains("mapped"));
        // A budget below the host weights still admits the accelerator plan, unless it copies them.
        assert!(cpu.total() > 1 << 29);
        assert!(gpu.total() <= 1 << 29);
        let copied = MemoryPlan::new(&input(&cfg, 1 << 30, 4096, Placement::Accelerator));
        assert_eq!((copied.weights, copied.mapped), (1 << 30, 0));
        assert!(admit_device(&gpu, gpu.device).is_ok());
        assert!(admit_device(&gpu, gpu.device - 1).unwrap_err().contains("--cuda-devices"));
    }

    #[test]
    fn chunk_fit_tries_halves_down_to_the_minimum() {
        assert_eq!(ChunkFit::fixed(256).candidates(), vec![256]);
        assert_eq!(ChunkFit::gpu_auto(32768, 256).candidates(), vec![4096, 2048, 1024, 512, 256]);
        // A short context takes no more rows than its prompt can fill.
        assert_eq!(ChunkFit::gpu_auto(1000, 256).candidates(), vec![1024, 512, 256]);
        assert_eq!(ChunkFit::gpu_auto(100, 256).candidates(), vec![256]);
        // A minimum that is not a power of two ends the list.
        assert_eq!(ChunkFit { max: 4096, min: 300, reserve: 0 }.candidates(), vec![4096, 2048, 1024, 512, 300]);
        assert_eq!(ChunkFit { max: 100, min: 300, reserve: 0 }.candidates(), vec![300]);
    }

    #[test]
    fn kv_states_multiply_the_kv_part() {
        let cfg = tiny();
        let one = MemoryPlan::new(&input(&cfg, 0, 4096, Placement::Cpu));
        let nine = MemoryPlan::new(&PlanInput { kv_states: 9, ..input(&cfg, 0, 4096, Placement::Cpu) });
        assert_eq!(nine.total() - one.total(), 8 * one.kv.total());
        assert!(nine.describe(0).contains("(9 states)"));
    }

    #[test]
    fn a_refusal_names_flag_values_that_fit() {
        let cfg = tiny();
        let inp = PlanInput { prefill_chunk: 512, ..input(&cfg, 1 << 20, 1 << 16, Placement::Cpu) };
        let plan = MemoryPlan::new(&inp);
        assert_eq!(admit(&inp, plan.total()), Ok(plan));
        let err = admit(&inp, plan.total() - 1).unwrap_err();
        assert!(err.contains("exceeds the budget"), "{err}");
        // Each suggested value, planned again, fits the budget (an independent check of the search).
        let fit = err.split("would fit:").nth(1).unwrap();
        let value = |flag: &str| -> f64 { fit.split(&format!("{flag} ")).nth(1).unwrap().split([',', ' ']).next().unwrap().parse().unwrap() };
        let ctx = value("--ctx") as usize;
        assert!(ctx < inp.ctx && MemoryPlan::new(&PlanInput { ctx, ..inp }).total() < plan.total(), "{err}");
        let chunk = value("--prefill-chunk") as usize;
        assert!(chunk < 512 && MemoryPlan::new(&PlanInput { prefill_chunk: chunk, ..inp }).total() < plan.total(), "{err}");
        assert!(value("--mem-limit-gb") * GIB >= plan.total() as f64, "{err}");
        // Weights over the budget: no context or chunk helps; the message says so and names the limit.
        let err = admit(&input(&cfg, 1 << 30, 4096, Placement::Cpu), 1 << 29).unwrap_err();
        assert!(err.contains("cannot make it fit") && !err.contains("would fit: --ctx") && err.contains("--mem-limit-gb 1.1"), "{err}");
    }

    #[test]
    fn largest_fitting_finds_the_boundary() {
        assert_eq!(largest_fitting(100, |v| v <= 37), Some(37));
        assert_eq!(largest_fitting(100, |v| v <= 500), Some(99));
        assert_eq!(largest_fitting(100, |_| false), None);
        assert_eq!(largest_fitting(1, |_| true), None);
    }
}
