//! ds4 users' command lines: every flag of the C engine's `ds4` and `ds4-bench`
//! (ds4-features.md §3, §4.2, §7) is accepted, or answered with exit 2 and one line saying the feature
//! is not built — never clap's unknown-argument error. Then the issue's acceptance commands on the
//! embedded tiny model, and the diagnostics against independent references (HF `tokenizers` for
//! `--dump-tokens`, a log-softmax computed here for `--logprobs-top-k`).
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::str::FromStr;

fn ds4() -> Command { Command::new(env!("CARGO_BIN_EXE_ds4")) }
fn bench() -> Command { Command::new(env!("CARGO_BIN_EXE_ds4-bench")) }

fn run(mut c: Command, args: &[&str]) -> Output { c.args(args).output().unwrap() }
fn stderr(o: &Output) -> String { String::from_utf8_lossy(&o.stderr).into_owned() }
fn stdout(o: &Output) -> String { String::from_utf8_lossy(&o.stdout).into_owned() }

/// A per-test scratch directory.
fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("ds4-flags-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn write(dir: &Path, name: &str, text: &str) -> String {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p.to_str().unwrap().to_string()
}

/// Not clap's "unexpected argument" (the failure ds4 users met).
fn assert_known(args: &[String], o: &Output) {
    let e = stderr(o);
    assert!(!e.contains("unexpected argument") && !e.contains("unrecognized"), "{args:?} is unknown to clap: {e}");
}

/// Exit 2 and exactly one line that says the feature is not built (or where it lives).
fn assert_not_yet(args: &[String], o: &Output) {
    let e = stderr(o);
    assert_eq!(o.status.code(), Some(2), "{args:?}: {e}");
    assert_eq!(e.trim().lines().count(), 1, "{args:?}: one line: {e}");
    assert!(e.contains("not built") || e.contains("ds4-server"), "{args:?}: says it is not built: {e}");
}

fn owned(v: &[&str]) -> Vec<String> { v.iter().map(|s| s.to_string()).collect() }

/// An MTP file for the tiny shape (the embedded default model's): `ds4-gguf synth tiny --mtp-out`.
fn mtp_file(dir: &Path) -> String {
    let m = dir.join("tiny-mtp.gguf");
    let o = Command::new(env!("CARGO_BIN_EXE_ds4-gguf")).args(["synth", "tiny"]).arg(dir.join("tiny.gguf")).arg("--mtp-out").arg(&m).output().unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    m.to_str().unwrap().to_string()
}

/// ds4's flags not built here, each with a value where it takes one.
/// (`--metal`/`--vulkan` are built with `--features wgpu`: tests/backend_choice.rs.)
const DS4_NOT_YET: &[&[&str]] = &[
    &["--rocm"],
    &["--mtp-model", "support.gguf"],
    &["--mtp-exact-sampling"],
    &["--mtp-timing"],
    &["--dspark"],
    &["--dspark-confidence", "0.6"],
    &["--dspark-strict"],
    &["--glm-mtp", "glm.gguf"],
    &["--dir-steering-policy", "always"],
    &["--ssd-streaming"],
    &["--ssd-streaming-cold"],
    &["--ssd-streaming-cache-experts", "20GB"],
    &["--ssd-streaming-preload-experts", "64"],
    &["--ssd-streaming-full-layers", "2"],
    &["--simulate-used-memory", "8"],
    &["--gpu-vram", "auto"],
    &["--cuda-tensor-parallel"],
    &["--tensor-parallel", "2"],
    &["--transport", "rdma"],
    &["--rdma-device", "mlx5_0"],
    &["--vision", "enc.gguf"],
    &["--expert-profile", "p.json"],
    &["--head-test"],
    &["--first-token-test"],
    &["--metal-graph-test"],
    &["--metal-graph-full-test"],
    &["--metal-graph-prompt-test"],
    &["--server"],
];

#[test]
fn every_ds4_flag_is_accepted_or_answered_not_yet() {
    let d = scratch("ds4");
    let prompt = write(&d, "prompt.txt", "Quel ramo del lago di Como");
    let text = write(&d, "text.txt", "Quel ramo del lago di Como, che volge a mezzogiorno.");
    let turns = write(&d, "turns.txt", "USER: Hi there\nASSISTANT: Hello.\n");
    let lp = d.join("lp.json").to_str().unwrap().to_string();
    let lg = d.join("lg.json").to_str().unwrap().to_string();
    let model = ds4_engine::resolve_model(None).unwrap().path().to_str().unwrap().to_string();
    let mtp = mtp_file(&d);
    // Accepted flags, each added to a tiny one-shot run (`-p Hi -n 1 --temp 0` unless it brings its own).
    let accepted: &[&[&str]] = &[
        &["-m", &model],
        &["--model", &model],
        &["--cpu"],
        &["--backend", "auto"],
        &["--backend", "cpu"],
        &["-c", "2048"],
        &["--ctx", "2048"],
        &["-t", "1"],
        &["--threads", "1"],
        &["--quality"],
        &["--qat", "off"],
        &["--qat", "on"],
        &["--power", "90"],
        &["--prefill-chunk", "64"],
        &["--prompt", "Hi"],
        &["--prompt-file", &prompt],
        &["-sys", "Be brief"],
        &["--system", ""],
        &["--tokens", "1"],
        &["--temp", "0.7"],
        &["--top-p", "0.9"],
        &["--min-p", "0.1"],
        &["--top-k", "5"],
        &["--seed", "7"],
        &["--think"],
        &["--think-max"],
        &["--nothink"],
        &["--inspect"],
        &["--dump-tokens"],
        &["--dump-logprobs", &lp],
        &["--logprobs-top-k", "3"],
        &["--dump-logits", &lg],
        &["--decode-consistency", "4"],
        &["--raw-prompt"],
        &["--prefix-file", &turns],
        &["--gpu-devices", "0"],
        &["--mem-limit-gb", "8"],
        &["--debug"],
        &["--cpu", "--mtp", &mtp],
        &["--cpu", "--mtp", &mtp, "--mtp-draft", "4", "--mtp-margin", "0", "--tokens", "8"],
    ];
    for extra in accepted {
        let mut args = owned(extra);
        if !args.iter().any(|a| a == "-p" || a == "--prompt" || a == "--prompt-file") {
            args.extend(owned(&["-p", "Hi"]));
        }
        args.extend(owned(&["-n", "1", "--temp", "0", "--ctx", "2048"]));
        let o = run(ds4(), &args.iter().map(String::as_str).collect::<Vec<_>>());
        assert_known(&args, &o);
        assert!(o.status.success(), "{args:?} should run: {}", stderr(&o));
    }
    let o = run(ds4(), &["--perplexity-file", &text, "--ctx", "2048"]);
    assert!(o.status.success() && stdout(&o).starts_with("perplexity: "), "{}", stderr(&o));
    // `--cuda` runs in a CUDA build; in a CPU-only build it says how to get one (never `--cuda-devices`).
    let args = owned(&["--cuda", "-p", "Hi", "-n", "1"]);
    let o = run(ds4(), &["--cuda", "-p", "Hi", "-n", "1"]);
    assert_known(&args, &o);
    assert!(!stderr(&o).contains("--cuda-devices"), "{}", stderr(&o));
    if !cfg!(feature = "cuda") {
        assert_eq!(o.status.code(), Some(2));
        assert_eq!(stderr(&o).trim().lines().count(), 1, "{}", stderr(&o));
    }
    for flag in DS4_NOT_YET {
        let mut args = owned(flag);
        args.extend(owned(&["-p", "Hi"]));
        let o = run(ds4(), &args.iter().map(String::as_str).collect::<Vec<_>>());
        assert_not_yet(&args, &o);
    }
    // The distributed flags parse (their own checks answer an incomplete set with exit 2).
    for args in [owned(&["--role", "worker"]), owned(&["--layers", "0:2", "-p", "Hi"]), owned(&["--dist-activation-bits", "8", "--role", "worker"])] {
        let o = run(ds4(), &args.iter().map(String::as_str).collect::<Vec<_>>());
        assert_known(&args, &o);
    }
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn every_ds4_bench_flag_is_accepted_or_answered_not_yet() {
    let d = scratch("bench");
    let text = write(&d, "p.txt", &"Quel ramo del lago di Como, che volge a mezzogiorno. ".repeat(8));
    let csv = d.join("out.csv").to_str().unwrap().to_string();
    let dump = d.join("logits").to_str().unwrap().to_string();
    let model = ds4_engine::resolve_model(None).unwrap().path().to_str().unwrap().to_string();
    let mtp = mtp_file(&d);
    let accepted: &[&[&str]] = &[
        &["--prompt-file", &text],
        &["--chat-prompt-file", &text],
        &["--chat-prompt-file", &text, "-sys", "Be brief"],
        &["-m", &model],
        &["--ctx-alloc", "256"],
        &["--step-incr", "16"],
        &["--step-mul", "2"],
        &["--gen-tokens", "2"],
        &["--tokens", "2"],
        &["--csv", &csv],
        &["--cpu"],
        &["--backend", "auto"],
        &["-t", "1"],
        &["--quality"],
        &["--qat", "off"],
        &["--power", "90"],
        &["--dump-frontier-logits-dir", &dump],
        &["--cpu", "--mtp", &mtp, "--mtp-draft", "2", "--mtp-margin", "0"],
    ];
    for extra in accepted {
        let mut args = owned(extra);
        if !args.iter().any(|a| a.ends_with("prompt-file")) {
            args.extend(owned(&["--prompt-file", &text]));
        }
        args.extend(owned(&["--ctx-start", "32", "--ctx-max", "64"]));
        if !args.iter().any(|a| a.contains("tokens")) {
            args.extend(owned(&["-n", "2"]));
        }
        let o = run(bench(), &args.iter().map(String::as_str).collect::<Vec<_>>());
        assert_known(&args, &o);
        assert!(o.status.success(), "{args:?} should run: {}", stderr(&o));
    }
    for flag in [&["--rocm"][..], &["--dspark"], &["--ssd-streaming"], &["--dir-steering-policy", "off"], &["--gpu-vram", "auto"]] {
        let mut args = owned(flag);
        args.extend(owned(&["--prompt-file", &text]));
        let o = run(bench(), &args.iter().map(String::as_str).collect::<Vec<_>>());
        assert_not_yet(&args, &o);
    }
    let _ = std::fs::remove_dir_all(&d);
}

/// The issue's command: a system prompt, the exact kernels, greedy, four tokens.
#[test]
fn acceptance_one_shot_with_system_prompt_and_quality() {
    let o = run(ds4(), &["--cpu", "-sys", "Be brief", "--quality", "-p", "Hi", "-n", "4", "--temp", "0"]);
    let e = stderr(&o);
    assert!(o.status.success(), "{e}");
    let stats = e.lines().find(|l| l.starts_with("prompt: ")).expect("stats line");
    if stats.contains("generated: 4 tokens") {
        assert!(e.contains("generation stopped at the -n limit (4 tokens)"), "says it stopped at -n: {e}");
    }
    // --quality reaches the engine: its logits are the exact path's, close to but not the int8 path's.
    let d = scratch("quality");
    let (exact, fast) = (d.join("exact.json"), d.join("fast.json"));
    for (file, extra) in [(&exact, Some("--quality")), (&fast, None)] {
        let mut args = vec!["-sys", "Be brief", "-p", "Hi", "--dump-logits", file.to_str().unwrap()];
        args.extend(extra);
        assert!(run(ds4(), &args).status.success());
    }
    let logits = |p: &Path| -> Vec<f64> {
        let v: Value = serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap();
        v["logits"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect()
    };
    let (a, b) = (logits(&exact), logits(&fast));
    let max = a.iter().fold(0.0f64, |m, x| m.max(x.abs()));
    let diff = a.iter().zip(&b).fold(0.0f64, |m, (x, y)| m.max((x - y).abs()));
    assert!(diff > 0.0, "--quality changes the kernels");
    assert!(diff < 0.2 * max, "both paths compute the same model: max diff {diff} of max |logit| {max}");
    let _ = std::fs::remove_dir_all(&d);
}

/// `--qat off` reaches the engine (the FP8/FP4 simulation moves the logits a little), `--qat on` is the
/// default, and any other value is a usage error.
#[test]
fn qat_switch_reaches_the_engine() {
    let d = scratch("qat");
    let dump = |name: &str, extra: &[&str]| -> Vec<f64> {
        let f = d.join(name);
        let mut args = vec!["--cpu", "-p", "Hi", "--dump-logits", f.to_str().unwrap()];
        args.extend(extra);
        let o = run(ds4(), &args);
        assert!(o.status.success(), "{}", stderr(&o));
        let v: Value = serde_json::from_str(&std::fs::read_to_string(&f).unwrap()).unwrap();
        v["logits"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect()
    };
    let (default, on, off) = (dump("d.json", &[]), dump("on.json", &["--qat", "on"]), dump("off.json", &["--qat", "off"]));
    assert_eq!(default, on, "--qat on is the default");
    let max = on.iter().fold(0.0f64, |m, x| m.max(x.abs()));
    let diff = on.iter().zip(&off).fold(0.0f64, |m, (x, y)| m.max((x - y).abs()));
    assert!(diff > 0.0, "--qat off changes the numerics");
    assert!(diff < 0.2 * max, "same model either way: max diff {diff} of max |logit| {max}");
    for (bin, rest) in [(ds4(), ["-p", "Hi"]), (bench(), ["--prompt-file", "p.txt"])] {
        let o = run(bin, &["--qat", "maybe", rest[0], rest[1]]);
        assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
        assert!(stderr(&o).contains("--qat"), "{}", stderr(&o));
    }
    let _ = std::fs::remove_dir_all(&d);
}

/// The issue's bench command, with small frontiers: a chat-rendered prompt, 8 tokens per frontier,
/// a 4096-token allocation; --ctx-max is measured although the default step (2048) jumps past it.
#[test]
fn acceptance_bench_with_chat_prompt_file() {
    let d = scratch("bench-accept");
    // Shorter than the frontiers: the rendered chat is repeated to fill them (as ds4-bench says).
    let f = write(&d, "F.txt", &"Quel ramo del lago di Como, che volge a mezzogiorno. ".repeat(4));
    let dump = d.join("frontiers");
    let o = run(
        bench(),
        &["-n", "8", "--ctx-alloc", "4096", "--chat-prompt-file", &f, "--ctx-start", "128", "--ctx-max", "320", "--dump-frontier-logits-dir", dump.to_str().unwrap()],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let csv = stdout(&o);
    let mut lines = csv.lines();
    assert_eq!(lines.next(), Some("ctx_tokens,prefill_tokens,prefill_tps,gen_tokens,gen_tps,kvcache_bytes"));
    let rows: Vec<Vec<f64>> = lines.map(|l| l.split(',').map(|v| v.parse().unwrap()).collect()).collect();
    assert_eq!(rows.iter().map(|r| r[0] as usize).collect::<Vec<_>>(), [128, 320], "start, then --ctx-max");
    assert_eq!(rows.iter().map(|r| r[1] as usize).collect::<Vec<_>>(), [128, 192], "only the new interval is prefilled");
    assert!(rows.iter().all(|r| r[3] == 8.0), "-n 8 tokens per frontier");
    assert!(rows[1][5] > rows[0][5], "kvcache_bytes is the snapshot at the frontier, so it grows");
    // The sequence is the chat rendering: BOS, the user turn, the assistant opener (non-thinking).
    let ids: Vec<u32> = std::fs::read(dump.join("ctx-320.tokens.u32")).unwrap().chunks(4).map(|c| u32::from_le_bytes(c.try_into().unwrap())).collect();
    let logits = std::fs::read(dump.join("ctx-320.logits.f32")).unwrap();
    let tok = ds4_tokenizer::tiny_tokenizer().unwrap();
    let chat = tok.chat_ids().unwrap();
    assert_eq!(ids.len(), 320);
    assert_eq!(logits.len(), tok.n_vocab() * 4, "one f32 per vocabulary entry");
    assert_eq!(ids[0], chat.bos);
    assert!(ids.contains(&chat.user) && ids.contains(&chat.assistant) && ids.contains(&chat.think_end), "rendered as a non-thinking chat");
    let _ = std::fs::remove_dir_all(&d);
}

/// `ds4 --logprobs-top-k 3 --temp 0 -p Ciao -n 4`: one JSON line per token, three alternatives, the
/// greedy choice the most likely; step 0 equals a log-softmax of `--dump-logits` computed here.
#[test]
fn acceptance_logprobs_top_k() {
    let o = run(ds4(), &["--logprobs-top-k", "3", "--temp", "0", "-p", "Ciao", "-n", "4"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let steps: Vec<Value> = stdout(&o).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert!(!steps.is_empty() && steps.len() <= 4, "{steps:?}");
    for (i, s) in steps.iter().enumerate() {
        assert_eq!(s["step"], i);
        let top = s["top_logprobs"].as_array().unwrap();
        assert_eq!(top.len(), 3);
        let lp: Vec<f64> = top.iter().map(|t| t["logprob"].as_f64().unwrap()).collect();
        assert!(lp.windows(2).all(|w| w[0] >= w[1]) && lp[0] <= 0.0, "sorted log-probabilities: {lp:?}");
        assert_eq!(s["id"], top[0]["id"], "greedy picks the most likely token");
        assert_eq!(s["logprob"].as_f64().unwrap(), lp[0]);
    }
    let d = scratch("logprobs");
    let f = d.join("l.json");
    assert!(run(ds4(), &["-p", "Ciao", "--dump-logits", f.to_str().unwrap()]).status.success());
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&f).unwrap()).unwrap();
    let l: Vec<f64> = v["logits"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect();
    let max = l.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let lse = max + l.iter().map(|x| (x - max).exp()).sum::<f64>().ln();
    let mut order: Vec<usize> = (0..l.len()).collect();
    order.sort_by(|&a, &b| l[b].total_cmp(&l[a]).then(a.cmp(&b)));
    for (k, t) in steps[0]["top_logprobs"].as_array().unwrap().iter().enumerate() {
        assert_eq!(t["id"].as_u64().unwrap() as usize, order[k]);
        assert!((t["logprob"].as_f64().unwrap() - (l[order[k]] - lse)).abs() < 1e-4, "{t} vs {}", l[order[k]] - lse);
    }
    // --dump-logprobs: ds4's file layout, greedy.
    let f = d.join("steps.json");
    assert!(run(ds4(), &["-p", "Ciao", "-n", "3", "--temp", "1", "--dump-logprobs", f.to_str().unwrap(), "--logprobs-top-k", "2"]).status.success());
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&f).unwrap()).unwrap();
    assert_eq!(v["top_k"], 2);
    for s in v["steps"].as_array().unwrap() {
        let top = s["top_logprobs"].as_array().unwrap();
        assert_eq!(top.len(), 2);
        assert_eq!(s["selected"]["id"], top[0]["token"]["id"], "greedy although --temp 1");
        assert!(top[0]["logit"].as_f64().unwrap() >= top[1]["logit"].as_f64().unwrap());
    }
    let _ = std::fs::remove_dir_all(&d);
}

/// `--dump-tokens` on a model carrying the real DeepSeek V4 vocabulary gives the ids of the reference
/// tokenizer (HF `tokenizers` loading the original tokenizer.json), special tokens included.
#[test]
fn dump_tokens_match_the_reference_tokenizer() {
    let d = scratch("tokens");
    let gguf = d.join("vocab-only.gguf");
    let (tokens, merges, types) = ds4_tokenizer::real_vocab().unwrap();
    let vocab = ds4_engine::vocab_from_parts(tokens, merges, types);
    let mut w = ds4_gguf::GgufWriter::new();
    ds4_model::synth::write_vocab_kv(&mut w, &vocab);
    w.begin(&gguf).unwrap().finish().unwrap();
    let reference = tokenizers::Tokenizer::from_str(&ds4_tokenizer::real_tokenizer_json().unwrap()).unwrap();
    for text in [
        "<｜begin▁of▁sentence｜>You are brief.<｜User｜>Ciao, come stai? 1234567<｜Assistant｜></think>",
        "fn main() {\n    println!(\"héllo 世界\");\n}\n\n",
        "  spaces,\ttabs and 12 digits 3.14159 — “quotes” カタカナ",
    ] {
        let o = run(ds4(), &["-m", gguf.to_str().unwrap(), "--dump-tokens", "-p", text]);
        assert!(o.status.success(), "{}", stderr(&o));
        let ours: Vec<u32> = stdout(&o).lines().map(|l| l.split('\t').next().unwrap().parse().unwrap()).collect();
        let want = reference.encode(text, false).unwrap().get_ids().to_vec();
        assert_eq!(ours, want, "{text:?}");
    }
    let _ = std::fs::remove_dir_all(&d);
}

/// Ctrl+C during a long prefill: the turn reports how far the prefill got and at what rate (not
/// `prefill 0.00 t/s`), and the chat goes on.
#[test]
fn ctrl_c_during_prefill_reports_honest_stats() {
    let d = scratch("prefill-cancel");
    let long = write(&d, "long.txt", &"Quel ramo del lago di Como, che volge a mezzogiorno. ".repeat(60));
    // Small chunks at 5 % duty: the prefill takes seconds.
    let cmd = format!("{} -n 4 --ctx 4096 --prefill-chunk 16 --power 5 --temp 0", env!("CARGO_BIN_EXE_ds4"));
    let mut p = rexpect::spawn(&cmd, Some(60_000)).unwrap();
    p.exp_string("ds4> ").unwrap();
    p.send_line(&format!("/read {long}")).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(1500));
    p.send_control('c').unwrap();
    p.exp_string("[prefill interrupted after ").unwrap();
    let (_, line) = p.exp_regex(r"prefill \d+ of \d+ tokens at [0-9.]+ t/s \(interrupted\)").unwrap();
    let rate: f64 = line.split(" at ").nth(1).unwrap().split(' ').next().unwrap().parse().unwrap();
    let done: usize = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    assert!(done > 0 && rate > 0.0, "{line}");
    p.exp_string("ds4> ").unwrap();
    p.send_line("Hi").unwrap();
    p.exp_string("generated: ").unwrap();
    p.exp_string("ds4> ").unwrap();
    p.send_line("/quit").unwrap();
    p.exp_eof().unwrap();
    let _ = std::fs::remove_dir_all(&d);
}

/// The chat keeps a history file (rustyline), and a thinking answer never shows a raw `</think>`.
#[test]
fn chat_history_file_and_no_raw_think_tags() {
    let d = scratch("history");
    let hist = d.join("hist");
    let cmd = format!("{} -n 64 --ctx 4096 --seed 3", env!("CARGO_BIN_EXE_ds4"));
    let mut s = rexpect::session::spawn_command(
        {
            let mut c = Command::new("sh");
            c.args(["-c", &cmd]).env("DS4_HISTORY", &hist);
            c
        },
        Some(60_000),
    )
    .unwrap();
    s.exp_string("ds4> ").unwrap();
    s.send_line("Tell me a story").unwrap();
    let (shown, _) = s.exp_string("generated: ").map(|t| (t, ())).unwrap();
    assert!(!shown.contains("</think>") && !shown.contains("<think>"), "{shown}");
    s.exp_string("ds4> ").unwrap();
    s.send_line("/quit").unwrap();
    s.exp_eof().unwrap();
    let h = std::fs::read_to_string(&hist).unwrap();
    assert!(h.contains("Tell me a story") && h.contains("/quit"), "{h}");
    let _ = std::fs::remove_dir_all(&d);
}

/// `--prefix-file`: the earlier turns come before the prompt, rendered as chat history (an earlier
/// assistant turn closed with `</think>` and EOS, spec §5.2).
#[test]
fn prefix_file_turns_precede_the_prompt() {
    let d = scratch("prefix");
    let turns = write(&d, "turns.txt", "USER: Hi there\nASSISTANT: Hello.\n");
    let prompt_tokens = |extra: &[&str]| -> usize {
        let mut args = vec!["-p", "Ciao", "-n", "1", "--temp", "0"];
        args.extend(extra);
        let o = run(ds4(), &args);
        assert!(o.status.success(), "{}", stderr(&o));
        let e = stderr(&o);
        let line = e.lines().find(|l| l.starts_with("prompt: ")).unwrap().to_string();
        line.split_whitespace().nth(1).unwrap().parse().unwrap()
    };
    let tok = ds4_tokenizer::tiny_tokenizer().unwrap();
    let history = tok.encode("<｜User｜>Hi there<｜Assistant｜></think>Hello.<｜end▁of▁sentence｜>").len();
    assert_eq!(prompt_tokens(&["--prefix-file", &turns]), prompt_tokens(&[]) + history);
    let bad = write(&d, "bad.txt", "USER: only a question\n");
    let o = run(ds4(), &["--prefix-file", &bad, "-p", "Ciao"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("complete USER:/ASSISTANT: pairs"), "{}", stderr(&o));
    let _ = std::fs::remove_dir_all(&d);
}

/// Think Max below its context size falls back to normal thinking with one warning, not one per turn.
#[test]
fn think_max_fallback_warns_once() {
    use std::io::Write;
    for (args, input) in [(&["--think-max"][..], "Hi\nHi again\n"), (&[][..], "/think-max\nHi\nHi again\n")] {
        let mut c = ds4();
        c.args(["-n", "2", "--temp", "0", "--ctx", "4096"]).args(args);
        c.env("DS4_HISTORY", std::env::temp_dir().join(format!("ds4-flags-history-{}", std::process::id())));
        c.stdin(std::process::Stdio::piped()).stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped());
        let mut child = c.spawn().unwrap();
        child.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
        let o = child.wait_with_output().unwrap();
        let e = stderr(&o);
        assert_eq!(e.matches("generated: ").count(), 2, "{e}");
        assert_eq!(e.lines().filter(|l| l.contains("393216")).count(), 1, "{args:?}: {e}");
    }
}

/// MTP flags: bad values and combinations exit 2 with one line before anything loads; greedy output
/// is the same with and without drafts.
#[test]
fn mtp_flags() {
    let d = scratch("mtp");
    let mtp = mtp_file(&d);
    let model = d.join("tiny.gguf").to_str().unwrap().to_string();
    let bad: &[(&[&str], &str)] = &[
        (&["--mtp", &mtp, "--mtp-draft", "0"], "--mtp-draft must be between 1 and 4"),
        (&["--mtp", &mtp, "--mtp-draft", "5"], "--mtp-draft must be between 1 and 4"),
        (&["--mtp", &mtp, "--mtp-margin", "-1"], "--mtp-margin must be a number >= 0"),
        (&["--mtp-draft", "2"], "need --mtp FILE"),
        (&["--mtp", &mtp, "--logprobs-top-k", "3"], "--mtp with --dump-logprobs/--logprobs-top-k"),
        (&["--mtp", &mtp, "--role", "coordinator", "--layers", "0:2"], "not available with --role"),
    ];
    for (args, want) in bad {
        let mut a = owned(args);
        a.extend(owned(&["-m", &model, "--cpu", "-p", "Hi"]));
        let o = run(ds4(), &a.iter().map(String::as_str).collect::<Vec<_>>());
        let e = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{a:?}: {e}");
        assert_eq!(e.trim().lines().count(), 1, "{a:?}: {e}");
        assert!(e.contains(want), "{a:?}: {e}");
    }
    // Not an MTP file: refused before loading, naming the file.
    let o = run(ds4(), &["-m", &model, "--cpu", "--mtp", &model, "-p", "Hi"]);
    assert!(!o.status.success() && stderr(&o).contains("is not an MTP file"), "{}", stderr(&o));
    // Same greedy text with drafts (margin 0: always draft), --debug reports them.
    let base = ["-m", model.as_str(), "--cpu", "-p", "Hello there", "-n", "24", "--temp", "0", "--nothink"];
    let plain = run(ds4(), &base);
    let mut with = base.to_vec();
    with.extend(["--mtp", mtp.as_str(), "--mtp-draft", "3", "--mtp-margin", "0", "--debug"]);
    let spec = run(ds4(), &with);
    assert!(plain.status.success() && spec.status.success(), "{}", stderr(&spec));
    assert_eq!(stdout(&plain), stdout(&spec));
    assert!(stderr(&spec).contains("ds4: mtp drafted"), "{}", stderr(&spec));
    // ds4-bench adds the MTP columns.
    let text = write(&d, "p.txt", &"one two three four five six seven eight ".repeat(8));
    let o = run(bench(), &["-m", &model, "--cpu", "--prompt-file", &text, "--ctx-start", "32", "--ctx-max", "64", "-n", "8", "--mtp", &mtp, "--mtp-margin", "0"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(out.lines().next().unwrap().ends_with(",mtp_drafted,mtp_accepted,mtp_acceptance"), "{out}");
    assert_eq!(out.lines().count(), 3, "{out}");
    let _ = std::fs::remove_dir_all(&d);
}
