//! Counters of device work that must happen only at load: a test snapshots them before and after
//! a token to prove nothing is uploaded, bound or compiled per token.
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub weight_uploads: AtomicU64,
    pub weight_bytes: AtomicU64,
    pub weight_imports: AtomicU64,
    pub bind_groups: AtomicU64,
    pub pipelines: AtomicU64,
    pub buffers: AtomicU64,
    pub step_writes: AtomicU64,
    pub activation_writes: AtomicU64,
    pub submits: AtomicU64,
}

/// A copy of the counters at one moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CounterSnapshot {
    /// Weight (resident tensor part / constant table) uploads, and their bytes.
    pub weight_uploads: u64,
    pub weight_bytes: u64,
    /// Resident-tensor parts imported from host memory without a copy (zero-copy).
    pub weight_imports: u64,
    /// Bind groups created.
    pub bind_groups: u64,
    /// Compute pipelines compiled.
    pub pipelines: u64,
    /// Device buffers created (any kind).
    pub buffers: u64,
    /// Writes of the 16-byte per-step uniform (token count, position): one per step.
    pub step_writes: u64,
    /// Host writes of activations (inputs of a test or of the first layer).
    pub activation_writes: u64,
    /// Queue submissions.
    pub submits: u64,
}

impl Counters {
    pub fn snapshot(&self) -> CounterSnapshot {
        CounterSnapshot {
            weight_uploads: self.weight_uploads.load(Relaxed),
            weight_bytes: self.weight_bytes.load(Relaxed),
            weight_imports: self.weight_imports.load(Relaxed),
            bind_groups: self.bind_groups.load(Relaxed),
            pipelines: self.pipelines.load(Relaxed),
            buffers: self.buffers.load(Relaxed),
            step_writes: self.step_writes.load(Relaxed),
            activation_writes: self.activation_writes.load(Relaxed),
            submits: self.submits.load(Relaxed),
        }
    }
    pub fn add(c: &AtomicU64, n: u64) {
        c.fetch_add(n, Relaxed);
    }
}
