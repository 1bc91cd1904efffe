//! Every ds4-server flag of the C engine (its `usage()` and the shared engine flags) parses: each is
//! either accepted (the run then stops at the taken port, exit 1) or refused with exit 2 and one line
//! saying the feature is not in this build. None is an unknown-argument error.
mod common;

use common::BIN;
use std::net::TcpListener;
use std::process::Command;

/// (flag, value or "" for a switch)
const DS4_SERVER_FLAGS: &[(&str, &str)] = &[
    ("-m", "MODEL"),
    ("--model", "MODEL"),
    ("-n", "128"),
    ("--tokens", "128"),
    ("-c", "4096"),
    ("--ctx", "4096"),
    ("--host", "127.0.0.1"),
    ("--cors", ""),
    ("--trace", "TRACE"),
    ("--kv-disk-dir", "KVDIR"),
    ("--kv-disk-space-mb", "64"),
    ("--kv-cache-min-tokens", "512"),
    ("--kv-cache-cold-max-tokens", "30000"),
    ("--kv-cache-continued-interval-tokens", "10000"),
    ("--kv-cache-boundary-trim-tokens", "32"),
    ("--kv-cache-boundary-align-tokens", "2048"),
    ("--kv-cache-reject-different-quant", ""),
    ("--disable-exact-dsml-tool-replay", ""),
    ("--tool-memory-max-ids", "1000"),
    ("--max-queue", "4"),
    ("--batched-session", "4"),
    ("--mixed-prefill-quantum", "128"),
    ("--dir-steering-policy", "final-answer"),
    ("--chdir", "."),
    ("--cpu", ""),
    ("--cuda", ""),
    ("--metal", ""),
    ("--vulkan", ""),
    ("--rocm", ""),
    ("--backend", "cpu"),
    ("-t", "1"),
    ("--threads", "1"),
    ("--quality", ""),
    ("--qat", "off"),
    ("--mtp", "MTP"),
    ("--mtp-draft", "2"),
    ("--mtp-margin", "3.0"),
    ("--mtp-model", "mtp.gguf"),
    ("--mtp-exact-sampling", ""),
    ("--mtp-timing", ""),
    ("--dspark", ""),
    ("--dspark-confidence", "0.7"),
    ("--dspark-strict", ""),
    ("--dir-steering-file", "dir.f32"),
    ("--dir-steering-ffn", "-1.5"),
    ("--dir-steering-attn", "0"),
    ("--power", "50"),
    ("--prefill-chunk", "256"),
    ("--ssd-streaming", ""),
    ("--ssd-streaming-cold", ""),
    ("--ssd-streaming-cache-experts", "8GB"),
    ("--ssd-streaming-preload-experts", "4"),
    ("--ssd-streaming-full-layers", "2"),
    ("--simulate-used-memory", "8GB"),
    ("--gpu-vram", "auto"),
    ("--gpu-devices", "0"),
    ("--cuda-tensor-parallel", ""),
    ("--tensor-parallel", "2"),
    ("--transport", "tcp"),
    ("--vision", "vision.gguf"),
    ("--expert-profile", "profile.json"),
    ("--debug", ""),
    ("--think", ""),
    ("--nothink", ""),
    ("--think-max", ""),
    ("--temp", "0.5"),
    ("--top-p", "0.9"),
    ("--min-p", "0.05"),
    ("--top-k", "40"),
    ("--seed", "7"),
];

#[test]
fn every_ds4_server_flag_is_accepted_or_answered_with_not_built() {
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port().to_string();
    let dir = std::env::temp_dir().join(format!("ds4-flags-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // Checked for existence before the port (its size when the model loads).
    std::fs::write(dir.join("dir.f32"), b"").unwrap();
    // Checked against the model before the port: a real MTP file of the default model's shape.
    let mtp = dir.join("mtp.gguf");
    let spec = ds4_model::synth::SynthSpec { shape: "tiny", mix: ds4_model::synth::Mix::Q2, seed: 5, layers: None, vocab: None };
    ds4_model::synth::write_mtp(&spec, &mtp, |_, _| {}).unwrap();
    let model = ds4_engine::resolve_model(None).unwrap().path().to_path_buf();
    let mut accepted = 0;
    let mut not_built = 0;
    for (flag, value) in DS4_SERVER_FLAGS {
        let value = match *value {
            "MODEL" => model.to_str().unwrap().to_string(),
            "TRACE" => dir.join("trace.log").to_str().unwrap().to_string(),
            "KVDIR" => dir.join("kv").to_str().unwrap().to_string(),
            "MTP" => mtp.to_str().unwrap().to_string(),
            v => v.to_string(),
        };
        let mut cmd = Command::new(BIN);
        cmd.current_dir(&dir).args(["--port", &port]);
        if !matches!(*flag, "-m" | "--model") {
            cmd.args(["-m", model.to_str().unwrap()]);
        }
        cmd.arg(flag);
        if !value.is_empty() {
            cmd.arg(&value);
        }
        let out = cmd.output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!err.contains("unexpected argument") && !err.contains("unrecognized"), "{flag}: {err}");
        match out.status.code() {
            // Accepted: stopped at the taken port, before loading (a backend this build lacks is
            // refused before the port is bound).
            Some(1) => {
                assert!(err.contains("cannot listen") || (matches!(*flag, "--cuda" | "--metal" | "--vulkan") && err.contains("this binary was built without")), "{flag}: {err}");
                accepted += 1;
            }
            Some(2) => {
                let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
                assert_eq!(lines.len(), 1, "{flag}: one line expected: {err}");
                assert!(
                    err.contains("not available in this build")
                        || (*flag == "--cuda" && err.contains("cuda"))
                        || (flag.starts_with("--mtp-") && err.contains("need --mtp FILE"))
                        || (flag.starts_with("--dir-steering-") && err.contains("need --dir-steering-file")),
                    "{flag}: {err}"
                );
                not_built += 1;
            }
            c => panic!("{flag}: exit {c:?}: {err}"),
        }
    }
    assert!(accepted > 30 && not_built > 20, "accepted {accepted}, not built {not_built}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn kv_cache_min_tokens_is_kv_disk_min_tokens() {
    let out = Command::new(BIN).args(["--kv-cache-min-tokens", "0"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--kv-disk-min-tokens must be at least 1"));
    let out = Command::new(BIN).args(["--kv-cache-min-tokens", "600", "--kv-cache-cold-max-tokens", "500"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--kv-cache-cold-max-tokens must be 0 or at least"));
}

#[test]
fn chdir_changes_the_directory_before_the_model_is_resolved() {
    let out = Command::new(BIN).args(["--chdir", "/nonexistent-ds4-dir"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--chdir /nonexistent-ds4-dir"));
    // A relative -m resolves inside --chdir.
    let model = ds4_engine::resolve_model(None).unwrap().path().to_path_buf();
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port().to_string();
    let parent = model.parent().unwrap();
    let name = model.file_name().unwrap().to_str().unwrap();
    let out = Command::new(BIN).args(["--chdir", parent.to_str().unwrap(), "-m", name, "--port", &port]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("cannot listen"), "{err}");
}

#[test]
fn a_gpu_backend_not_built_names_the_cargo_feature() {
    // Flags are checked before the port is bound, the backend too (exit 1, as for --backend cuda in a
    // build without CUDA), with one line naming `--features wgpu`.
    let mut cases: Vec<(&[&str], &str)> = Vec::new();
    if !cfg!(feature = "wgpu") {
        for a in [&["--vulkan"][..], &["--metal"], &["--backend", "vulkan"], &["--backend", "metal"], &["--backend", "wgpu"]] {
            cases.push((a, "--features wgpu"));
        }
    } else if !cfg!(target_vendor = "apple") {
        cases.push((&["--metal"], "Apple"));
    }
    for (args, want) in cases {
        let out = Command::new(BIN).args(args).args(["--port", "0"]).env("XDG_RUNTIME_DIR", std::env::temp_dir()).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
        assert!(err.contains(want), "{args:?}: {err}");
        assert!(!err.contains("listening"), "{args:?}: refused only after listening: {err}");
    }
    // Two backend switches at once, or an unknown name, are usage errors.
    for args in [&["--cpu", "--vulkan"][..], &["--metal", "--vulkan"], &["--backend", "opencl"]] {
        let out = Command::new(BIN).args(args).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
    }
}

/// A coordinator's `--layers` that leave no layer for the worker owning the output head is a usage
/// error found from the model's metadata before the server listens (exit 2), as for `ds4 --role`.
#[test]
fn a_coordinator_range_without_room_for_a_worker_is_a_usage_error_before_listening() {
    let model = ds4_engine::resolve_model(None).unwrap().path().to_path_buf();
    let file = ds4_gguf::GgufFile::open(&model).unwrap();
    let n = ds4_model::Config::from_gguf(&file).unwrap().n_layer;
    let layers = format!("0:{}", n - 1);
    let out = Command::new(BIN)
        .args(["-m", model.to_str().unwrap(), "--backend", "cpu", "--port", "0", "--role", "coordinator", "--layers", &layers, "--listen", "127.0.0.1", "0"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("--layers") && err.contains("output head"), "{err}");
    assert!(!err.contains("listening"), "refused only after listening: {err}");
}

/// Values the engine refuses (out of its ranges) stop the server before it listens: exit 2 and one
/// line. Before, each printed "listening on ..." first and failed from the loading thread with exit 1.
#[test]
fn load_option_ranges_are_usage_errors_before_listening() {
    let cases: &[(&[&str], i32, &str)] = &[
        (&["--threads", "0"], 2, "--threads must be at least 1"),
        (&["--threads", "100000"], 2, "--threads 100000: at most"),
        (&["--ctx", "100000000000"], 2, "--ctx 100000000000: at most"),
        (&["--prefill-chunk", "100000000000"], 2, "--prefill-chunk 100000000000: at most"),
        (&["--kv-snapshots", "100000000"], 2, "--kv-snapshots 100000000: at most 65535"),
        // 2 x (1 + 2^63) used to wrap to 0 KV states: the plan counted none and the server started.
        (&["--batched-session", "2", "--kv-snapshots", "9223372036854775807"], 2, "--kv-snapshots 9223372036854775807: at most"),
        (&["--kv-snapshots", "18446744073709551615"], 2, "--kv-snapshots 18446744073709551615: at most"),
        (&["--batched-session", "256", "--kv-snapshots", "256"], 2, "65792 sessions held at once: at most 65536"),
        (&["--batched-session", "70000", "--kv-snapshots", "0"], 2, "sessions held at once: at most"),
    ];
    for (args, code, want) in cases {
        let out = Command::new(BIN).args(*args).args(["--port", "0", "--backend", "cpu"]).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(*code), "{args:?}: {err}");
        assert!(err.contains(want), "{args:?}: {err}");
        assert!(!err.contains("listening"), "{args:?}: refused only after listening: {err}");
        assert_eq!(err.lines().filter(|l| l.starts_with("ds4-server:") && !l.contains("embedded tiny default")).count(), 1, "{args:?}: {err}");
    }
}

/// Seconds flags too large for the clock are refused (exit 2). Before, `--header-timeout-secs
/// 18446744073709551615` started, then panicked every connection's task ("overflow when adding
/// duration to instant"), so even /health got no answer.
#[test]
fn seconds_flags_too_large_for_the_clock_are_refused() {
    for flag in ["--header-timeout-secs", "--body-timeout-secs", "--send-timeout-secs", "--keepalive-secs"] {
        let out = Command::new(BIN).args([flag, "18446744073709551615", "--port", "0"]).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{flag}: {err}");
        assert!(err.contains(flag) && err.contains("at most") && err.lines().count() == 1, "{flag}: {err}");
    }
}
