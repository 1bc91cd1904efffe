//! Per-token log-probabilities (`--logprobs-top-k N`, `--dump-logprobs FILE`).
//!
//! Which distribution: the model's next-token distribution, `log_softmax(logits)`, before temperature,
//! min-p and top-p — the distribution the sampler starts from, and exactly the one greedy decoding
//! takes its argmax of (so for `--temp 0` the chosen token always has the highest logprob). NaN logits
//! count as −∞, as in the sampler.
use ds4_tokenizer::Tokenizer;
use serde_json::{json, Value};

/// Largest N for `--logprobs-top-k` (ds4's limit).
pub const MAX_TOP_K: usize = 128;
/// ds4's default N for `--dump-logprobs`.
pub const DEFAULT_TOP_K: usize = 20;

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

fn key(l: f32) -> f32 { if l.is_nan() { f32::NEG_INFINITY } else { l } }

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
pub fn step(logits: &[f32], chosen: u32, k: usize) -> Step {
    let lse = log_sum_exp(logits);
    let cand = |id: u32| {
        let logit = key(logits[id as usize]);
        Candidate { id, logit, logprob: (logit as f64 - lse) as f32 }
    };
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

fn token_json(tok: &Tokenizer, id: u32) -> Value {
    json!({ "id": id, "text": tok.token_text(id), "bytes": tok.token_bytes(id) })
}

/// One line of `--logprobs-top-k` output (JSON Lines on stdout).
pub fn line(tok: &Tokenizer, index: usize, s: &Step) -> String {
    let top: Vec<Value> = s.top.iter().map(|c| json!({ "id": c.id, "text": tok.token_text(c.id), "logprob": c.logprob })).collect();
    json!({ "step": index, "id": s.chosen.id, "text": tok.token_text(s.chosen.id), "bytes": tok.token_bytes(s.chosen.id), "logprob": s.chosen.logprob, "top_logprobs": top })
        .to_string()
}

/// The `--dump-logprobs` file in ds4's layout: a header, then one entry per step with the selected
/// token and the top alternatives (each with its raw logit and logprob). `selected` also carries
/// the chosen token's logit and logprob (an addition; ds4 readers ignore it).
pub fn dump(tok: &Tokenizer, prompt_tokens: usize, ctx: usize, top_k: usize, steps: &[Step]) -> Value {
    let steps: Vec<Value> = steps
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let mut sel = token_json(tok, s.chosen.id);
            sel["logit"] = json!(s.chosen.logit);
            sel["logprob"] = json!(s.chosen.logprob);
            let top: Vec<Value> = s.top.iter().map(|c| json!({ "token": token_json(tok, c.id), "logit": c.logit, "logprob": c.logprob })).collect();
            json!({ "step": i, "selected": sel, "top_logprobs": top })
        })
        .collect();
    json!({ "source": "dwarfstar", "prompt_tokens": prompt_tokens, "ctx": ctx, "top_k": top_k, "steps": steps })
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
    }
}
