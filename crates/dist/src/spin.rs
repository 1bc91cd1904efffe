//! Busy-waiting before blocking on a hop's reply or the next request (`--dist-spin-us`): a thread
//! that blocks is woken by the kernel, which on an idle many-core host costs tens to hundreds of
//! microseconds per wake-up; spinning a bounded time first catches a reply that comes soon.
//! Process-wide: set once at start (0, the default, blocks at once).
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

static SPIN_US: AtomicU64 = AtomicU64::new(0);

/// Longest spin this process does before a blocking wait.
pub fn set(d: Duration) { SPIN_US.store(d.as_micros() as u64, Ordering::Relaxed) }

pub fn budget() -> Duration { Duration::from_micros(SPIN_US.load(Ordering::Relaxed)) }

/// Polls `ready` until it gives a value or the spin budget runs out (None: block now).
pub fn poll<T>(mut ready: impl FnMut() -> Option<T>) -> Option<T> {
    let b = budget();
    if b.is_zero() {
        return None;
    }
    let t0 = Instant::now();
    loop {
        if let Some(v) = ready() {
            return Some(v);
        }
        if t0.elapsed() >= b {
            return None;
        }
        std::hint::spin_loop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spins_until_ready_or_the_budget_ends() {
        set(Duration::ZERO);
        assert_eq!(poll(|| Some(1)), None, "no budget: block at once");
        set(Duration::from_millis(20));
        let mut n = 0;
        assert_eq!(poll(|| { n += 1; (n == 5).then_some(n) }), Some(5));
        let t0 = Instant::now();
        assert_eq!(poll(|| None::<()>), None);
        assert!(t0.elapsed() >= Duration::from_millis(20));
        set(Duration::ZERO);
    }
}
