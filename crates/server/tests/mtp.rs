//! `ds4-server --mtp`: greedy completions are the same tokens with and without MTP drafts, sampled
//! requests still answer, and /metrics and the request log count drafted and accepted tokens; bad MTP
//! flags exit 2.
mod common;

use common::*;
use serde_json::{json, Value};
use std::process::Command;

fn mtp_file() -> std::path::PathBuf {
    let p = std::env::temp_dir().join(format!("ds4-server-mtp-{}.gguf", std::process::id()));
    let spec = ds4_model::synth::SynthSpec { shape: "tiny", mix: ds4_model::synth::Mix::Q2, seed: 5, layers: None, vocab: None };
    ds4_model::synth::write_mtp(&spec, &p, |_, _| {}).unwrap();
    p
}

fn complete(port: u16, extra: Value) -> Value {
    let mut b = json!({ "messages": [{ "role": "user", "content": "draft and verify" }], "max_tokens": 40, "reasoning_effort": "none" });
    b.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
    let (st, body) = request(port, "POST", "/v1/chat/completions", b.to_string().as_bytes());
    assert_eq!(st, 200, "{body}");
    serde_json::from_str(&body).unwrap()
}

fn metric(port: u16, name: &str) -> f64 {
    let (_, m) = request(port, "GET", "/metrics", b"");
    m.lines().find(|l| l.starts_with(name) && l[name.len()..].starts_with(' ')).and_then(|l| l.split_whitespace().nth(1)).and_then(|v| v.parse().ok()).unwrap_or_else(|| panic!("{name} missing: {m}"))
}

#[test]
fn greedy_is_unchanged_and_metrics_count_drafts() {
    let mtp = mtp_file();
    let model = ds4_engine::resolve_model(None).unwrap().path().to_path_buf();
    let m = model.to_str().unwrap();
    let plain = Server::start(&["-m", m, "--backend", "cpu"], true);
    let spec = Server::start(&["-m", m, "--backend", "cpu", "--mtp", mtp.to_str().unwrap(), "--mtp-draft", "3", "--mtp-margin", "0"], true);
    let greedy = json!({ "temperature": 0.0 });
    let a = complete(plain.port, greedy.clone());
    let b = complete(spec.port, greedy);
    assert_eq!(a["choices"][0]["message"], b["choices"][0]["message"], "greedy output differs with --mtp");
    assert_eq!(a["usage"]["completion_tokens"], b["usage"]["completion_tokens"]);
    let drafted = metric(spec.port, "ds4_mtp_drafted_tokens_total");
    assert!(drafted > 0.0, "nothing drafted");
    assert!(metric(spec.port, "ds4_mtp_accepted_tokens_total") <= drafted);
    assert_eq!(metric(spec.port, "ds4_mtp_last_drafted_tokens"), drafted);
    assert_eq!(metric(plain.port, "ds4_mtp_drafted_tokens_total"), 0.0);
    // The request log line counts accepted/drafted tokens.
    assert!(spec.log_text().contains(" mtp="), "{}", spec.log_text());
    assert!(!plain.log_text().contains(" mtp="));
    // A sampled request drafts too and answers.
    let s = complete(spec.port, json!({ "temperature": 0.9, "seed": 3 }));
    assert!(s["usage"]["completion_tokens"].as_u64().unwrap() > 0);
    assert!(metric(spec.port, "ds4_mtp_drafted_tokens_total") > drafted);
    std::fs::remove_file(&mtp).ok();
}

#[test]
fn bad_mtp_flags_exit_2() {
    for args in [&["--mtp", "x.gguf", "--mtp-draft", "0"][..], &["--mtp", "x.gguf", "--mtp-draft", "5"], &["--mtp-margin", "1"], &["--mtp", "x.gguf", "--mtp-margin", "-1"], &["--mtp", "x.gguf", "--batched-session", "2", "--backend", "cpu"], &["--mtp", "x.gguf", "--backend", "cuda", "--cuda-devices", "0,1"]] {
        let out = Command::new(BIN).args(args).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains("mtp") || err.contains("cuda"), "{args:?}: {err}");
    }
}

/// An `--mtp` file that does not fit the model is refused before the server listens (exit 1, the file
/// named), not after it has said it is listening and loaded the weights.
#[test]
fn an_mtp_file_that_does_not_fit_is_refused_before_listening() {
    let model = ds4_engine::resolve_model(None).unwrap().path().to_path_buf();
    // The model file itself: no MTP tensors.
    let out = Command::new(BIN).args(["-m", model.to_str().unwrap(), "--backend", "cpu", "--port", "0", "--mtp", model.to_str().unwrap()]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("--mtp") && err.contains("not an MTP file"), "{err}");
    assert!(!err.contains("listening"), "refused only after listening: {err}");
}
