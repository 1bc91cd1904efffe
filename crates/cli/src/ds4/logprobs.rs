//! Per-token log-probabilities (`--logprobs-top-k N`, `--dump-logprobs FILE`).
//!
//! The numbers come from `ds4_engine::logprobs` (log-softmax of the raw logits, before temperature,
//! min-p and top-p), the same definition the server's OpenAI `logprobs` use.
use ds4_tokenizer::Tokenizer;
use serde_json::{json, Value};

pub use ds4_engine::logprobs::{step, Step};

/// Largest N for `--logprobs-top-k` (ds4's limit).
pub const MAX_TOP_K: usize = 128;
/// ds4's default N for `--dump-logprobs`.
pub const DEFAULT_TOP_K: usize = 20;

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
