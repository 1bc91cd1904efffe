//! Picks the pipelined prefill's micro-chunk from measured costs (when `--dist-prefill-chunk` is
//! not given). Splitting a prompt lets stage k work on chunk i while stage k+1 works on chunk i-1,
//! but each chunk costs a fixed overhead per stage (a GPU's per-batch cost is large: Flash q2 on an
//! H200 prefills 4096 tokens at 4090 t/s in one batch and at 1720 t/s in batches of 1024), so the
//! best size depends on the machine. The model, per chunk of `c` tokens:
//! - a stage computes it in `t(c) = a*c + o` (fitted by least squares to the coordinator's own
//!   prefill chunks, whose sizes differ at least at the end of a prompt);
//! - a hop moves it in `x(c) = b*c` (send time per token measured on the hops);
//! - `S` stages in a pipeline take `(n-1) * max(t, x) + S*t + (S-1)*x` for `n = ceil(P/c)` chunks.
//!
//! Candidates are multiples of 128 tokens (the compressor's block) up to the engine's chunk; the
//! cheapest wins. Until two chunk sizes have been measured the engine's chunk is used as it is.
use std::collections::VecDeque;

/// Multiples of this are tried (the compressor's block).
pub const STEP: usize = 128;
const MAX_SAMPLES: usize = 64;

/// Measured prefill costs of one session.
#[derive(Debug, Clone, Default)]
pub struct CostModel {
    /// (tokens, seconds) of the coordinator's local stage per prefill chunk.
    local: VecDeque<(usize, f64)>,
    /// Tokens and send seconds over the hops' prefill chunks.
    hop_tokens: f64,
    hop_send_s: f64,
}

/// A fitted `t(c) = a*c + o`, `x(c) = b*c` (seconds).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Fit {
    pub a: f64,
    pub o: f64,
    pub b: f64,
}

impl CostModel {
    pub fn add_local(&mut self, tokens: usize, secs: f64) {
        if tokens < 2 {
            return; // decode steps are another regime
        }
        if self.local.len() == MAX_SAMPLES {
            self.local.pop_front();
        }
        self.local.push_back((tokens, secs));
    }

    pub fn add_hop(&mut self, tokens: usize, send_secs: f64) {
        if tokens >= 2 {
            self.hop_tokens += tokens as f64;
            self.hop_send_s += send_secs;
        }
    }

    /// Least-squares fit; None until two distinct sizes were measured.
    pub fn fit(&self) -> Option<Fit> {
        let n = self.local.len() as f64;
        let (sx, sy) = self.local.iter().fold((0.0, 0.0), |(x, y), &(c, t)| (x + c as f64, y + t));
        let (mx, my) = (sx / n, sy / n);
        let (sxx, sxy) = self.local.iter().fold((0.0, 0.0), |(xx, xy), &(c, t)| (xx + (c as f64 - mx).powi(2), xy + (c as f64 - mx) * (t - my)));
        if self.local.len() < 2 || sxx <= 0.0 {
            return None;
        }
        let a = (sxy / sxx).max(1e-12);
        let o = (my - a * mx).max(0.0);
        let b = if self.hop_tokens > 0.0 { self.hop_send_s / self.hop_tokens } else { 0.0 };
        Some(Fit { a, o, b })
    }
}

/// Modelled seconds of a prefill of `prompt` tokens in chunks of `c` through `stages` stages.
pub fn modelled(f: &Fit, prompt: usize, stages: usize, c: usize) -> f64 {
    let n = prompt.div_ceil(c.max(1)) as f64;
    let c = c.min(prompt) as f64;
    let t = f.a * c + f.o;
    let x = f.b * c;
    let s = stages as f64;
    (n - 1.0) * t.max(x) + s * t + (s - 1.0) * x
}

/// The micro-chunk for a prompt of `prompt` tokens: the engine's `max_chunk` until the costs are
/// known, then the modelled cheapest multiple of [`STEP`] (or `max_chunk` itself).
pub fn micro_chunk(prompt: usize, stages: usize, max_chunk: usize, fit: Option<Fit>) -> usize {
    let max_chunk = max_chunk.max(1);
    let Some(f) = fit else { return max_chunk };
    if stages < 2 || prompt <= STEP {
        return max_chunk;
    }
    let mut best = (modelled(&f, prompt, stages, max_chunk), max_chunk);
    let mut c = STEP;
    while c < max_chunk {
        let t = modelled(&f, prompt, stages, c);
        // Ties (within 1 %) go to the larger chunk: fewer batches, fewer frames.
        if t < best.0 * 0.99 {
            best = (t, c);
        }
        c += STEP;
    }
    best.1
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fit_recovers_a_linear_cost() {
        let mut m = CostModel::default();
        assert!(m.fit().is_none());
        for c in [256usize, 1024, 100, 4096] {
            m.add_local(c, 2e-4 * c as f64 + 0.05);
        }
        m.add_hop(1000, 0.01);
        let f = m.fit().unwrap();
        assert!((f.a - 2e-4).abs() < 1e-9 && (f.o - 0.05).abs() < 1e-9 && (f.b - 1e-5).abs() < 1e-12, "{f:?}");
    }

    #[test]
    fn large_per_chunk_overhead_keeps_big_chunks_small_overhead_splits() {
        // The H200 numbers above: a = 0.132 ms/token, o = 0.46 s per batch: one 4096 batch is best.
        let gpu = Fit { a: 1.32e-4, o: 0.46, b: 2e-5 };
        assert_eq!(micro_chunk(4096, 2, 4096, Some(gpu)), 4096);
        // A CPU-like stage (o small against a*c): a 2-stage pipeline wants several chunks.
        let cpu = Fit { a: 1e-3, o: 0.005, b: 1e-5 };
        let c = micro_chunk(4096, 2, 4096, Some(cpu));
        assert!(c < 4096 && c.is_multiple_of(STEP), "{c}");
        assert!(modelled(&cpu, 4096, 2, c) < modelled(&cpu, 4096, 2, 4096));
        // Unknown costs, one stage, or a short prompt: the engine's chunk.
        assert_eq!(micro_chunk(4096, 2, 4096, None), 4096);
        assert_eq!(micro_chunk(4096, 1, 4096, Some(cpu)), 4096);
        assert_eq!(micro_chunk(100, 3, 512, Some(cpu)), 512);
    }
}
