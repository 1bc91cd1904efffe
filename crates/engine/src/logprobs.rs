//! Per-token log-probabilities, shared by the CLI (`--logprobs-top-k`) and the server (OpenAI
//! `logprobs`).
//!
//! Which distribution: the model's next-token distribution, `log_softmax(logits)`, before temperature,
//! min-p and top-p — the distribution the sampler starts from, and exactly the one greedy decoding
//! takes its argmax of (so for temperature 0 the chosen token always has the highest logprob). NaN
//! logits count as −∞, as in the sampler.

/// One candidate: id, raw logit, log-probability.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Candidate {
    pub id: u32,
    pub logit: f32,
    pub logprob: f32,
}

/// One generated token and the alternatives the model gave at that step.
#[derive(Debug, Clone)]
pub struct Step {
    pub chosen: Candidate,
    /// The N most likely tokens, most likely first (lower id first on ties).
    pub top: Vec<Candidate>,
}

fn key(l: f32) -> f32 {
    if l.is_nan() { f32::NEG_INFINITY } else { l }
}

/// log Σ exp(logits), computed around the max so it cannot overflow.
fn log_sum_exp(logits: &[f32]) -> f64 {
    let max = logits.iter().map(|&l| key(l)).fold(f32::NEG_INFINITY, f32::max);
    if !max.is_finite() {
        return max as f64;
    }
    let s: f64 = logits.iter().map(|&l| ((key(l) - max) as f64).exp()).sum();
    max as f64 + s.ln()
}

/// The step for `chosen` sampled from `logits`, with the `k` most likely alternatives.
/// `chosen` outside the logits (a scripted token) gets logit and logprob −∞.
pub fn step(logits: &[f32], chosen: u32, k: usize) -> Step {
    let lse = log_sum_exp(logits);
    let cand = |id: u32| {
        let logit = logits.get(id as usize).map_or(f32::NEG_INFINITY, |&l| key(l));
        Candidate { id, logit, logprob: (logit as f64 - lse) as f32 }
    };
    if k == 0 {
        return Step { chosen: cand(chosen), top: Vec::new() };
    }
    let mut ids: Vec<u32> = (0..logits.len() as u32).collect();
    let order = |a: &u32, b: &u32| key(logits[*b as usize]).total_cmp(&key(logits[*a as usize])).then(a.cmp(b));
    let k = k.min(ids.len());
    if k > 0 && k < ids.len() {
        ids.select_nth_unstable_by(k - 1, order);
    }
    ids.truncate(k);
    ids.sort_unstable_by(order);
    Step { chosen: cand(chosen), top: ids.into_iter().map(cand).collect() }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn logprobs_are_a_normalised_log_softmax() {
        let l = [1.0f32, 3.0, 2.0, f32::NAN, 3.0];
        let s = step(&l, 2, 3);
        // Reference: softmax by hand over e^1, e^3, e^2, 0, e^3.
        let z = 1f64.exp() + 2.0 * 3f64.exp() + 2f64.exp();
        assert!((s.chosen.logprob as f64 - (2f64.exp() / z).ln()).abs() < 1e-6);
        assert_eq!(s.top.iter().map(|c| c.id).collect::<Vec<_>>(), [1, 4, 2], "by logit, lower id first on ties");
        let all = step(&l, 0, l.len());
        let mass: f64 = all.top.iter().map(|c| (c.logprob as f64).exp()).sum();
        assert!((mass - 1.0).abs() < 1e-6);
        assert_eq!(all.top.last().unwrap().logprob, f32::NEG_INFINITY, "NaN is -inf");
        assert_eq!(step(&l, 9, 0).chosen.logprob, f32::NEG_INFINITY, "an id outside the logits is -inf");
        assert!(step(&l, 1, 0).top.is_empty());
    }
}
