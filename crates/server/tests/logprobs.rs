//! OpenAI logprobs on the real binary: the 400 for more than 20 alternatives, a sampled (non-greedy)
//! request's logprobs, and that asking for logprobs does not change the greedy tokens.
mod common;

use common::*;
use serde_json::{json, Value};

fn chat(port: u16, body: Value) -> (u16, Value) {
    let (st, b) = request(port, "POST", "/v1/chat/completions", body.to_string().as_bytes());
    (st, serde_json::from_str(&b).unwrap_or_else(|e| panic!("{e}: {b}")))
}

fn body(extra: Value) -> Value {
    let mut b = json!({ "messages": [{ "role": "user", "content": "logprobs" }], "max_tokens": 6, "reasoning_effort": "none" });
    b.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
    b
}

#[test]
fn logprobs_requests() {
    let srv = Server::start(&[], true);
    // More than 20 alternatives: 400 naming the field, on chat and on completions.
    let (st, v) = chat(srv.port, body(json!({ "logprobs": true, "top_logprobs": 21 })));
    assert_eq!(st, 400, "{v}");
    assert_eq!(v["error"]["param"], "top_logprobs", "{v}");
    assert!(v["error"]["message"].as_str().unwrap().contains("top_logprobs"), "{v}");
    let (st, b) = request(srv.port, "POST", "/v1/completions", br#"{"prompt":"x","logprobs":21}"#);
    assert_eq!(st, 400, "{b}");
    assert!(b.contains("\"param\":\"logprobs\""), "{b}");
    let (st, v) = chat(srv.port, body(json!({ "top_logprobs": 3 })));
    assert_eq!(st, 400, "top_logprobs without logprobs: {v}");

    // Sampled: each token's logprob is that of a token of the distribution, no higher than the most
    // likely one; the alternatives are sorted, as many as asked, and their probabilities sum to <= 1.
    let sampled = body(json!({ "logprobs": true, "top_logprobs": 5, "temperature": 1.0, "top_p": 1.0, "min_p": 0.0, "seed": 7 }));
    let (st, v) = chat(srv.port, sampled.clone());
    assert_eq!(st, 200, "{v}");
    let content = v["choices"][0]["logprobs"]["content"].as_array().unwrap().clone();
    assert_eq!(content.len() as u64, v["usage"]["completion_tokens"].as_u64().unwrap(), "{v}");
    for e in &content {
        let lp = e["logprob"].as_f64().unwrap();
        let top = e["top_logprobs"].as_array().unwrap();
        assert_eq!(top.len(), 5);
        let tl: Vec<f64> = top.iter().map(|t| t["logprob"].as_f64().unwrap()).collect();
        assert!(tl.windows(2).all(|w| w[0] >= w[1]), "{tl:?}");
        assert!(lp <= tl[0] + 1e-6 && lp <= 0.0, "{e}");
        assert!(tl.iter().map(|l| l.exp()).sum::<f64>() <= 1.0 + 1e-5);
        if let Some(same) = top.iter().find(|t| t["bytes"] == e["bytes"]) {
            assert!((same["logprob"].as_f64().unwrap() - lp).abs() < 1e-6, "{e}");
        }
    }
    // The same seed gives the same tokens and numbers.
    let (_, again) = chat(srv.port, sampled);
    assert_eq!(again["choices"][0]["logprobs"]["content"], Value::Array(content));

    // Greedy: asking for logprobs does not change the tokens.
    let (_, with) = chat(srv.port, body(json!({ "temperature": 0, "logprobs": true })));
    let (_, without) = chat(srv.port, body(json!({ "temperature": 0 })));
    assert_eq!(with["choices"][0]["message"]["content"], without["choices"][0]["message"]["content"]);
    assert_eq!(without["choices"][0]["logprobs"], Value::Null);
}
