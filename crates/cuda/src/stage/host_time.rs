//! Where a one-token step's wall time goes on the host (DS4_CUDA_HOSTTIME=1, a measuring aid): the
//! graph launch call, the wait for the device, the logits copy, and the caller's time between steps.
use std::time::{Duration, Instant};

#[derive(Default)]
pub(super) struct HostTime {
    on: bool,
    steps: u32,
    launch: Duration,
    wait: Duration,
    copy: Duration,
    total: Duration,
    last: Option<Instant>,
}

impl HostTime {
    pub(super) fn from_env() -> Self { Self { on: std::env::var("DS4_CUDA_HOSTTIME").is_ok_and(|v| v != "0"), ..Default::default() } }

    pub(super) fn now(&self) -> Option<Instant> { self.on.then(Instant::now) }

    /// A forward call begins: a one-token call is a step, anything else (prefill) breaks the chain.
    pub(super) fn call(&mut self, one_token: bool) {
        let t = self.now();
        if one_token {
            self.step(t);
        } else {
            self.last = None;
        }
    }

    /// A step begins: the time since the previous step began is that step's wall time.
    fn step(&mut self, t: Option<Instant>) {
        let Some(t) = t else { return };
        if self.last.is_none() {
            // A new chain: what was counted since the last report belongs to other calls (prefill).
            *self = Self { on: true, ..Default::default() };
        }
        if let Some(l) = self.last {
            self.total += t - l;
            self.steps += 1;
            if self.steps == 64 {
                self.report();
            }
        }
        self.last = Some(t);
    }

    pub(super) fn add_launch(&mut self, t: Option<Instant>) { self.launch += t.map_or(Duration::ZERO, |t| t.elapsed()) }
    pub(super) fn add_wait(&mut self, t: Option<Instant>) { self.wait += t.map_or(Duration::ZERO, |t| t.elapsed()) }
    pub(super) fn add_copy(&mut self, t: Option<Instant>) { self.copy += t.map_or(Duration::ZERO, |t| t.elapsed()) }

    fn report(&mut self) {
        let us = |d: Duration| d.as_secs_f64() * 1e6 / self.steps as f64;
        let rest = self.total.saturating_sub(self.launch + self.wait + self.copy);
        eprintln!(
            "host time per step over {}: wall {:.1} us = graph launch {:.1} + device wait {:.1} + logits copy {:.1} + other {:.1}",
            self.steps,
            us(self.total),
            us(self.launch),
            us(self.wait),
            us(self.copy),
            us(rest)
        );
        *self = Self { on: true, last: self.last, ..Default::default() };
    }
}
