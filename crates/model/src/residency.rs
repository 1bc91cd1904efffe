//! Counters of weight residency operations (map, bind, upload), per phase. Weights become resident
//! once at load; these counters prove that prefill and decode perform none (seed 001: re-establishing
//! residency every token cost ~80x).
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Map = 0,
    Bind = 1,
    Upload = 2,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    Load = 0,
    Prefill = 1,
    Decode = 2,
}

static PHASE: AtomicUsize = AtomicUsize::new(0);
static COUNTS: [AtomicU64; 9] = [const { AtomicU64::new(0) }; 9];

/// Sets the phase that following operations are charged to.
pub fn set_phase(p: Phase) {
    PHASE.store(p as usize, Ordering::Relaxed);
}

pub fn phase() -> Phase {
    match PHASE.load(Ordering::Relaxed) {
        1 => Phase::Prefill,
        2 => Phase::Decode,
        _ => Phase::Load,
    }
}

/// Records `n` operations of kind `op` in the current phase.
pub fn count(op: Op, n: u64) {
    COUNTS[PHASE.load(Ordering::Relaxed) * 3 + op as usize].fetch_add(n, Ordering::Relaxed);
}

/// Snapshot: `[phase][op]` counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Counters(pub [[u64; 3]; 3]);

impl Counters {
    pub fn get(&self, p: Phase, op: Op) -> u64 { self.0[p as usize][op as usize] }
    /// Operations of any kind in a phase.
    pub fn total(&self, p: Phase) -> u64 { self.0[p as usize].iter().sum() }
}

pub fn snapshot() -> Counters {
    let mut c = Counters::default();
    for p in 0..3 {
        for o in 0..3 {
            c.0[p][o] = COUNTS[p * 3 + o].load(Ordering::Relaxed);
        }
    }
    c
}

static LOADED: AtomicU64 = AtomicU64::new(0);

/// Records `n` weight bytes read from the file into memory (copied, or pre-faulted in a mapping).
pub fn add_loaded(n: u64) {
    LOADED.fetch_add(n, Ordering::Relaxed);
}

/// Weight bytes read into memory by loads so far in this process: the memory plan refuses before
/// this moves (design §5).
pub fn loaded_bytes() -> u64 { LOADED.load(Ordering::Relaxed) }
