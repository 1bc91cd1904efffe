//! OpenAI log-probabilities: the request fields (`logprobs`, `top_logprobs`, the Responses `include`),
//! the per-token record the worker sends, and its JSON in each endpoint's schema.
//!
//! The numbers are `ds4_engine::logprobs`: log-softmax of the model's raw logits, before temperature,
//! min-p and top-p (the CLI's `--logprobs-top-k` gives the same numbers). A logprob of −∞ (a NaN or
//! −∞ logit) is sent as −9999.0, OpenAI's value for a token of no probability, since JSON has no −∞.
use crate::errors::ApiError;
use crate::fields::{self, Obj};
use ds4_engine::logprobs::Step;
use ds4_tokenizer::Tokenizer;
use serde_json::{json, Value};

/// Most alternatives per token a request may ask for (OpenAI's limit).
pub const MAX_TOP: u64 = 20;
/// The Responses `include` value that asks for output-text logprobs.
pub const RESPONSES_INCLUDE: &str = "message.output_text.logprobs";

/// One token: its text, bytes and logprob, plus the most likely alternatives (most likely first).
#[derive(Debug, Clone)]
pub struct TokenLogprob {
    pub token: Piece,
    pub top: Vec<Piece>,
}

#[derive(Debug, Clone)]
pub struct Piece {
    pub text: String,
    pub bytes: Vec<u8>,
    pub logprob: f32,
}

impl Piece {
    fn new(tok: &Tokenizer, id: u32, logprob: f32) -> Self {
        Self { text: tok.token_text(id), bytes: tok.token_bytes(id).to_vec(), logprob }
    }

    fn logprob(&self) -> f64 {
        if self.logprob.is_finite() { self.logprob as f64 } else { -9999.0 }
    }

    /// `{token, logprob, bytes}` (chat completions, responses).
    fn json(&self) -> Value {
        json!({ "token": self.text, "logprob": self.logprob(), "bytes": self.bytes })
    }
}

impl TokenLogprob {
    pub fn new(tok: &Tokenizer, s: &Step) -> Self {
        Self { token: Piece::new(tok, s.chosen.id, s.chosen.logprob), top: s.top.iter().map(|c| Piece::new(tok, c.id, c.logprob)).collect() }
    }

    /// An entry of chat `logprobs.content[]` / Responses `output_text.logprobs[]`.
    pub fn json(&self) -> Value {
        let mut v = self.token.json();
        v["top_logprobs"] = Value::Array(self.top.iter().map(Piece::json).collect());
        v
    }
}

/// The chat `choices[].logprobs` object for `entries`.
pub fn chat_json(entries: &[TokenLogprob]) -> Value {
    json!({ "content": entries.iter().map(TokenLogprob::json).collect::<Vec<_>>(), "refusal": null })
}

/// The completions `choices[].logprobs` object; `offset` is the text offset (in characters) of the
/// first entry, so streamed chunks continue the offsets of the previous ones.
pub fn completions_json(entries: &[TokenLogprob], offset: &mut usize) -> Value {
    let mut text_offset = Vec::with_capacity(entries.len());
    for e in entries {
        text_offset.push(*offset);
        *offset += e.token.text.chars().count();
    }
    let top: Vec<Value> = entries
        .iter()
        .map(|e| {
            let mut m = serde_json::Map::new();
            for p in &e.top {
                m.entry(p.text.clone()).or_insert(json!(p.logprob()));
            }
            Value::Object(m)
        })
        .collect();
    json!({
        "tokens": entries.iter().map(|e| e.token.text.clone()).collect::<Vec<_>>(),
        "token_logprobs": entries.iter().map(|e| e.token.logprob()).collect::<Vec<_>>(),
        "top_logprobs": top,
        "text_offset": text_offset,
    })
}

fn top_count(o: &Obj, key: &str) -> Result<Option<usize>, ApiError> {
    match fields::opt_u64(o, key)? {
        Some(n) if n > MAX_TOP => Err(ApiError::bad_request(format!("`{key}` must be within [0, {MAX_TOP}]")).param(key)),
        n => Ok(n.map(|n| n as usize)),
    }
}

/// Chat: `logprobs: true` turns them on, `top_logprobs` (0..=20, needs `logprobs: true`) sets the
/// alternatives. None: off.
pub fn chat_request(o: &Obj) -> Result<Option<usize>, ApiError> {
    let on = fields::opt_bool(o, "logprobs")?.unwrap_or(false);
    let top = top_count(o, "top_logprobs")?;
    if !on && top.is_some_and(|n| n > 0) {
        return Err(ApiError::bad_request("`top_logprobs` requires `logprobs` to be true").param("top_logprobs"));
    }
    Ok(on.then_some(top.unwrap_or(0)))
}

/// Completions: `logprobs: N` (0..=20) returns the chosen token's logprob and N alternatives.
pub fn completions_request(o: &Obj) -> Result<Option<usize>, ApiError> {
    top_count(o, "logprobs")
}

/// Responses: `include: ["message.output_text.logprobs"]` or `top_logprobs` (0..=20) turns them on.
pub fn responses_request(o: &Obj) -> Result<Option<usize>, ApiError> {
    let top = top_count(o, "top_logprobs")?;
    let included = match fields::opt_array(o, "include")? {
        Some(a) => a.iter().any(|v| v.as_str() == Some(RESPONSES_INCLUDE)),
        None => false,
    };
    Ok(if included || top.is_some_and(|n| n > 0) { Some(top.unwrap_or(0)) } else { None })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obj(v: Value) -> Obj {
        v.as_object().unwrap().clone()
    }

    #[test]
    fn request_fields() {
        assert_eq!(chat_request(&obj(json!({}))).unwrap(), None);
        assert_eq!(chat_request(&obj(json!({"logprobs": true}))).unwrap(), Some(0));
        assert_eq!(chat_request(&obj(json!({"logprobs": true, "top_logprobs": 20}))).unwrap(), Some(20));
        assert_eq!(chat_request(&obj(json!({"logprobs": true, "top_logprobs": 21}))).unwrap_err().param.as_deref(), Some("top_logprobs"));
        assert!(chat_request(&obj(json!({"top_logprobs": 3}))).is_err());
        assert!(chat_request(&obj(json!({"logprobs": "yes"}))).is_err());
        assert_eq!(completions_request(&obj(json!({"logprobs": 5}))).unwrap(), Some(5));
        assert_eq!(completions_request(&obj(json!({"logprobs": null}))).unwrap(), None);
        assert!(completions_request(&obj(json!({"logprobs": 21}))).is_err());
        assert_eq!(responses_request(&obj(json!({"include": [RESPONSES_INCLUDE]}))).unwrap(), Some(0));
        assert_eq!(responses_request(&obj(json!({"top_logprobs": 2}))).unwrap(), Some(2));
        assert_eq!(responses_request(&obj(json!({"include": []}))).unwrap(), None);
    }

    #[test]
    fn completions_offsets_continue() {
        let p = |t: &str, l: f32| Piece { text: t.into(), bytes: t.as_bytes().to_vec(), logprob: l };
        let e = vec![
            TokenLogprob { token: p("Hé", -0.5), top: vec![p("Hé", -0.5), p("x", -1.0)] },
            TokenLogprob { token: p("!", f32::NEG_INFINITY), top: vec![] },
        ];
        let mut off = 3;
        let v = completions_json(&e, &mut off);
        assert_eq!(v["text_offset"], json!([3, 5]));
        assert_eq!(off, 6);
        assert_eq!(v["token_logprobs"], json!([-0.5, -9999.0]));
        assert_eq!(v["top_logprobs"][0]["x"], json!(-1.0));
        assert_eq!(chat_json(&e)["content"][0]["bytes"], json!([72, 195, 169]));
    }
}
