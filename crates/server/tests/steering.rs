//! `ds4-server --dir-steering-*`: the policy decides which phases of a request are steered. `off`
//! answers as the plain model; `decoding` and `always` change the answer; `final-answer` leaves the
//! reasoning as the plain model's and steers what follows it (every generated token without thinking);
//! with `--batched-session` each session's row follows its own request's phase. Bad steering flags are
//! refused before the port is bound (a file of the wrong size when the model's metadata is read).
//! `--power` is here too: another ds4 server flag that changes how, not what, the worker computes.
mod common;

use common::*;
use serde_json::{json, Value};
use std::path::PathBuf;
use std::process::Command;

/// A direction file for the embedded default model: a unit vector per layer (fixed pseudo-random).
fn direction_file(name: &str) -> PathBuf {
    let model = ds4_engine::resolve_model(None).unwrap().path().to_path_buf();
    let f = ds4_gguf::GgufFile::open(&model).unwrap();
    let cfg = ds4_model::Config::from_gguf(&f).unwrap();
    let (l, e) = (cfg.n_layer, cfg.n_embd);
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut bytes = Vec::with_capacity(l * e * 4);
    for _ in 0..l {
        let row: Vec<f32> = (0..e)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x >> 40) as f32 / (1u64 << 24) as f32 - 0.5
            })
            .collect();
        let n = row.iter().map(|v| v * v).sum::<f32>().sqrt();
        row.iter().for_each(|v| bytes.extend_from_slice(&(v / n).to_le_bytes()));
    }
    let p = std::env::temp_dir().join(format!("ds4-steer-{name}-{}.f32", std::process::id()));
    std::fs::write(&p, bytes).unwrap();
    p
}

fn model() -> String { ds4_engine::resolve_model(None).unwrap().path().to_str().unwrap().to_string() }

/// (reasoning, content) of a greedy answer.
fn answer(port: u16, effort: &str) -> (String, String) {
    let b = json!({ "messages": [{ "role": "user", "content": "steer this answer" }], "max_tokens": 24, "temperature": 0.0, "reasoning_effort": effort });
    let (st, body) = request(port, "POST", "/v1/chat/completions", b.to_string().as_bytes());
    assert_eq!(st, 200, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    let m = &v["choices"][0]["message"];
    (m["reasoning_content"].as_str().unwrap_or_default().to_string(), m["content"].as_str().unwrap_or_default().to_string())
}

fn steered(policy: &str, file: &PathBuf, extra: &[&str]) -> Server {
    let m = model();
    let mut args = vec!["-m", &m, "--backend", "cpu", "--dir-steering-file", file.to_str().unwrap(), "--dir-steering-ffn", "-8", "--dir-steering-attn", "4", "--dir-steering-policy", policy];
    args.extend_from_slice(extra);
    Server::start(&args, true)
}

#[test]
fn each_policy_steers_its_phases() {
    let file = direction_file("policy");
    let m = model();
    let plain = Server::start(&["-m", &m, "--backend", "cpu"], true);
    let (p_none, p_high) = (answer(plain.port, "none"), answer(plain.port, "high"));
    assert!(!p_high.0.is_empty(), "the thinking request reasons");

    let off = steered("off", &file, &[]);
    assert_eq!((answer(off.port, "none"), answer(off.port, "high")), (p_none.clone(), p_high.clone()), "off answers as the plain model");

    let decoding = steered("decoding", &file, &[]);
    let d_none = answer(decoding.port, "none");
    assert_ne!(d_none, p_none, "decoding steers the answer");
    assert_ne!(answer(decoding.port, "high").0, p_high.0, "decoding steers the reasoning");

    let always = steered("always", &file, &[]);
    assert_ne!(answer(always.port, "none"), p_none, "always steers");

    let fin = steered("final-answer", &file, &[]);
    let f_high = answer(fin.port, "high");
    let f_none = answer(fin.port, "none");
    assert_eq!(f_none, d_none, "without thinking every generated token is the final answer");
    // The reasoning (up to and including its end, sampled before steering starts) is the plain one.
    assert!(f_high.0.starts_with(p_high.0.trim_end()) || p_high.0.starts_with(f_high.0.trim_end()), "final-answer left the reasoning alone:\n{f_high:?}\n{p_high:?}");

    // Batched: two sessions in one decode step, each steered by its own phase, answer as alone.
    let batched = steered("final-answer", &file, &["--batched-session", "2"]);
    let port = batched.port;
    let h = std::thread::spawn(move || answer(port, "high"));
    let b_none = answer(batched.port, "none");
    assert_eq!((b_none, h.join().unwrap()), (f_none, f_high), "a batched session is steered as it is alone");
    std::fs::remove_file(&file).ok();
}

#[test]
fn bad_steering_flags_are_refused() {
    let m = model();
    let missing = std::env::temp_dir().join("ds4-steer-missing.f32");
    for (args, want) in [
        (vec!["--dir-steering-ffn", "1"], "need --dir-steering-file"),
        (vec!["--dir-steering-file", missing.to_str().unwrap()], "ds4-steer-missing.f32"),
        (vec!["--dir-steering-file", &m, "--dir-steering-ffn", "101"], "-100 to 100"),
        (vec!["--dir-steering-file", &m, "--dir-steering-policy", "sometimes"], "sometimes"),
        (vec!["--dir-steering-file", &m, "--backend", "cuda"], "not built for the CUDA backend"),
    ] {
        let out = Command::new(BIN).args(&args).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(want), "{args:?}: {err}");
    }
    // A file of another size is refused when the model's metadata is read, before any weight.
    let bad = std::env::temp_dir().join(format!("ds4-steer-short-{}.f32", std::process::id()));
    std::fs::write(&bad, [0u8; 64]).unwrap();
    let out = Command::new(BIN).args(["-m", &m, "--backend", "cpu", "--port", &free_port().to_string(), "--dir-steering-file", bad.to_str().unwrap()]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("64 bytes, expected"), "{err}");
    std::fs::remove_file(&bad).ok();
}

/// `--power N` (ds4's duty cycle): the same answer, with sleeps after each prefill chunk and decoded
/// token that keep the worker busy about N % of the time (20 %: about 5x the time; asserted > 2x);
/// 0 and 101 are refused at start.
#[test]
fn power_keeps_the_answer_and_slows_it_down() {
    let m = model();
    let full = Server::start(&["-m", &m, "--backend", "cpu"], true);
    let slow = Server::start(&["-m", &m, "--backend", "cpu", "--power", "20"], true);
    let timed = |port: u16| {
        let t0 = std::time::Instant::now();
        let a = answer(port, "none");
        (a, t0.elapsed().as_secs_f64())
    };
    let _ = timed(full.port);
    let (a, tf) = timed(full.port);
    let (b, ts) = timed(slow.port);
    eprintln!("--power 20: {ts:.3}s, full speed {tf:.3}s ({:.1}x)", ts / tf);
    assert_eq!(a, b, "--power changes only the speed");
    assert!(ts > 2.0 * tf, "--power 20 took {ts:.3}s, full speed {tf:.3}s");
    for v in ["0", "101"] {
        let out = Command::new(BIN).args(["--power", v]).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "--power {v}: {}", String::from_utf8_lossy(&out.stderr));
    }
}
