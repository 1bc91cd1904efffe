//! Read bandwidth of this machine, measured the way decode reads weights: all threads streaming a
//! buffer far larger than the caches. Benchmarks divide by it to report fractions of the hardware.
use rayon::prelude::*;
use std::time::Instant;

/// Best-of-`reps` GB/s of a parallel sum over `mib` MiB (allocated and touched once before timing).
pub fn read_bandwidth_gbps(mib: usize, reps: usize) -> f64 {
    let n = mib * (1 << 20) / 8;
    let buf: Vec<u64> = (0..n as u64).collect();
    let mut best = 0f64;
    for _ in 0..reps.max(1) {
        let t0 = Instant::now();
        let s: u64 = buf.par_chunks(1 << 16).map(|c| c.iter().fold(0u64, |a, &b| a.wrapping_add(b))).reduce(|| 0, u64::wrapping_add);
        let dt = t0.elapsed().as_secs_f64();
        std::hint::black_box(s);
        best = best.max((n * 8) as f64 / dt / 1e9);
    }
    best
}
