//! `--mixed-prefill-quantum N` with `--batched-session`: while a session generates, a long prompt that
//! arrives is prefilled in N-token slices, each followed by a decode step of the generating session
//! (counted by `ds4_batch_steps_total`); alone it goes in `--prefill-chunk` slices.
mod common;

use common::*;
use serde_json::json;
use std::process::Command;

fn steps(port: u16) -> u64 {
    let (_, m) = request(port, "GET", "/metrics", b"");
    m.lines().find(|l| l.starts_with("ds4_batch_steps_total ")).and_then(|l| l.split_whitespace().nth(1)).and_then(|v| v.parse().ok()).expect("ds4_batch_steps_total")
}

/// Decode steps taken while a 600-token prompt is prefilled beside a generating session.
fn steps_during_prefill(quantum: &str) -> u64 {
    let m = ds4_engine::resolve_model(None).unwrap().path().to_str().unwrap().to_string();
    let s = Server::start(&["-m", &m, "--backend", "cpu", "--batched-session", "2", "--prefill-chunk", "512", "--mixed-prefill-quantum", quantum], true);
    let port = s.port;
    // A long generation in the background.
    let bg = std::thread::spawn(move || {
        let b = json!({ "prompt": "a long story", "max_tokens": 3000, "temperature": 0.0 });
        // Cut short when the server stops at the end of the measurement.
        let _ = try_request(port, "POST", "/v1/completions", b.to_string().as_bytes(), &[]);
    });
    let t0 = std::time::Instant::now();
    while steps(port) < 5 {
        assert!(t0.elapsed().as_secs() < 30, "the background generation did not start");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let before = steps(port);
    let long = "word ".repeat(600);
    let b = json!({ "prompt": long, "max_tokens": 1, "temperature": 0.0 });
    let (st, body) = request(port, "POST", "/v1/completions", b.to_string().as_bytes());
    assert_eq!(st, 200, "{body}");
    let during = steps(port) - before;
    drop(s);
    let _ = bg.join();
    during
}

#[test]
fn a_long_prompt_yields_to_generating_sessions_every_quantum() {
    let small = steps_during_prefill("16");
    let whole = steps_during_prefill("4096");
    eprintln!("decode steps during a 600-token prefill: quantum 16 -> {small}, quantum 4096 -> {whole}");
    assert!(small >= 30, "quantum 16: {small} decode steps between the slices of 600 tokens");
    assert!(whole < small / 4, "quantum 4096: {whole} decode steps (one slice, then its chunks)");
    let out = Command::new(BIN).args(["--mixed-prefill-quantum", "0"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
}
