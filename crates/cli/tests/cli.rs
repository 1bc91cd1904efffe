//! The `ds4` binaries as a user runs them: one-shot output and stats line, the interactive chat through a
//! pseudo-terminal, exit codes and one-line messages for bad flags and missing files.
use std::process::Command;

fn ds4() -> Command {
    Command::new(env!("CARGO_BIN_EXE_ds4"))
}

#[test]
fn one_shot_prints_text_and_the_stats_line() {
    let out = ds4().args(["-p", "Ciao, come stai?", "-n", "12", "--temp", "0"]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(!out.stdout.is_empty(), "generated text on stdout");
    let stats = err.lines().find(|l| l.starts_with("prompt: ")).expect("stats line");
    assert!(stats.contains("prefill") && stats.contains("generated: 12 tokens") || stats.contains("generated: "), "{stats}");
    assert!(err.contains("embedded tiny default model"), "says which model it uses: {err}");
}

#[test]
fn greedy_one_shot_is_reproducible() {
    let run = || ds4().args(["-p", "Quel ramo del lago di Como", "-n", "16", "--temp", "0"]).output().unwrap().stdout;
    assert_eq!(run(), run());
}

#[test]
fn bad_flags_and_missing_files_exit_nonzero_with_one_line() {
    let out = ds4().args(["--no-such-flag"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let out = ds4().args(["-m", "/nonexistent/model.gguf", "-p", "x"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains("/nonexistent/model.gguf"), "{err}");
    let out = ds4().args(["-p", "x", "--prefill-chunk", "0"]).output().unwrap();
    assert_ne!(out.status.code(), Some(0));
    let out = ds4().args(["-p", "x", "--ctx", "notanumber"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let gg = Command::new(env!("CARGO_BIN_EXE_ds4-gguf")).args(["inspect", "/nonexistent.gguf"]).output().unwrap();
    assert_eq!(gg.status.code(), Some(1));
    let bench = Command::new(env!("CARGO_BIN_EXE_ds4-bench")).args(["--prompt-file", "/nonexistent.txt"]).output().unwrap();
    assert_eq!(bench.status.code(), Some(1));
    let bench = Command::new(env!("CARGO_BIN_EXE_ds4-bench")).args(["--prompt-file", "x", "--step-mul", "1.5", "--step-incr", "2"]).output().unwrap();
    assert_eq!(bench.status.code(), Some(2));
}

#[test]
fn interactive_chat_through_a_pty() {
    let cmd = format!("{} -n 8 --temp 0", env!("CARGO_BIN_EXE_ds4"));
    let mut p = rexpect::spawn(&cmd, Some(60_000)).unwrap();
    p.exp_string("> ").unwrap();
    p.send_line("/help").unwrap();
    p.exp_string("/nothink").unwrap();
    p.exp_string("> ").unwrap();
    p.send_line("/nothink").unwrap();
    p.exp_string("mode: None").unwrap();
    p.exp_string("> ").unwrap();
    p.send_line("Hello there").unwrap();
    p.exp_string("generated: ").unwrap();
    p.exp_string("> ").unwrap();
    p.send_line("And a second turn").unwrap();
    p.exp_string("generated: ").unwrap();
    p.exp_string("> ").unwrap();
    p.send_line("/ctx nonsense").unwrap();
    p.exp_string("usage: /ctx N").unwrap();
    p.exp_string("> ").unwrap();
    p.send_line("/quit").unwrap();
    p.exp_eof().unwrap();
}

#[test]
fn ctrl_c_stops_the_generation_and_returns_to_the_prompt() {
    // A seed whose answer is long, slowed to 5 % duty so that Ctrl+C lands mid-generation.
    let cmd = format!("{} -n 100000 --ctx 4096 --seed 2 --power 5", env!("CARGO_BIN_EXE_ds4"));
    let mut p = rexpect::spawn(&cmd, Some(60_000)).unwrap();
    p.exp_string("> ").unwrap();
    p.send_line("Tell me a very long story").unwrap();
    std::thread::sleep(std::time::Duration::from_millis(1500));
    p.send_control('c').unwrap();
    p.exp_string("[generation interrupted]").unwrap();
    p.exp_string("> ").unwrap();
    p.send_line("/quit").unwrap();
    p.exp_eof().unwrap();
}

#[test]
fn bench_csv_rows_are_consistent() {
    let prompt = std::env::temp_dir().join(format!("ds4-bench-prompt-{}.txt", std::process::id()));
    std::fs::write(&prompt, "Quel ramo del lago di Como, che volge a mezzogiorno, tra due catene non interrotte di monti. ".repeat(40)).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_ds4-bench"))
        .args(["--prompt-file", prompt.to_str().unwrap(), "--ctx-start", "64", "--ctx-max", "512", "--step-mul", "2", "--gen-tokens", "4"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let csv = String::from_utf8(out.stdout).unwrap();
    let mut lines = csv.lines();
    assert_eq!(lines.next(), Some("ctx_tokens,prefill_tokens,prefill_tps,gen_tokens,gen_tps,kvcache_bytes"));
    let rows: Vec<Vec<f64>> = lines.map(|l| l.split(',').map(|v| v.parse().unwrap()).collect()).collect();
    assert_eq!(rows.iter().map(|r| r[0] as usize).collect::<Vec<_>>(), vec![64, 128, 256, 512]);
    let mut sum = 0.0;
    for r in &rows {
        sum += r[1];
        assert_eq!(sum, r[0], "prefill tokens add up to the frontier");
        assert_eq!(r[3], 4.0);
        assert!(r[2] > 0.0 && r[4] > 0.0 && r[5] > 0.0);
    }
    assert!(rows.windows(2).all(|w| w[1][5] >= w[0][5]), "KV grows with the context");
}

/// Flag combinations from the field reports (seed 000 "minor" report and friends) exit 2 with a message.
#[test]
fn invalid_distributed_flag_combinations_exit_2() {
    let cases: &[&[&str]] = &[
        &["--role", "coordinator", "--listen", "127.0.0.1", "9999", "-p", "x"],
        &["--role", "coordinator", "--layers", "0:2", "-p", "x"],
        &["--role", "worker", "--layers", "3:output"],
        &["--role", "bogus"],
        &["--role", "worker", "--layers", "1:output", "--coordinator", "127.0.0.1", "1", "--dist-activation-bits", "7"],
        &["--role", "coordinator", "--layers", "zero:two", "--listen", "127.0.0.1", "9999", "-p", "x"],
    ];
    for args in cases {
        let out = ds4().args(*args).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(!err.trim().is_empty(), "{args:?}: a message naming the problem");
    }
}

/// Runs two chat turns through a pty and returns what the terminal showed for each answer.
fn two_turns(cmd: &str) -> Vec<String> {
    let mut p = rexpect::spawn(cmd, Some(60_000)).unwrap();
    p.exp_string("stops a generation").unwrap();
    p.exp_string("> ").unwrap();
    let mut out = Vec::new();
    for line in ["Hello there", "And a second turn"] {
        p.send_line(line).unwrap();
        out.push(p.exp_string("prompt: ").unwrap());
        p.exp_string("> ").unwrap();
    }
    p.send_line("/quit").unwrap();
    p.exp_eof().unwrap();
    out
}

/// Interactive chat as a distributed coordinator (layers 0:2 here, 3:output in a worker process)
/// shows the same greedy answers, turn after turn, as the single process.
#[test]
fn interactive_chat_as_distributed_coordinator_matches_single_process() {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port().to_string();
    let mut worker = ds4()
        .args(["--role", "worker", "--layers", "3:output", "--coordinator", "127.0.0.1", &port, "--ctx", "512", "--threads", "1"])
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let bin = env!("CARGO_BIN_EXE_ds4");
    let route = two_turns(&format!("{bin} --role coordinator --layers 0:2 --listen 127.0.0.1 {port} -n 8 --temp 0 --ctx 512"));
    let _ = worker.kill();
    let _ = worker.wait();
    let single = two_turns(&format!("{bin} -n 8 --temp 0 --ctx 512"));
    assert_eq!(route, single);
    assert!(route.iter().all(|t| !t.trim().is_empty()), "{route:?}");
}

/// `--imatrix-dataset` / `--imatrix-out`: the dataset's prompts (blocks after marker lines) prefilled on
/// the CPU, and the `.dat` in ds4's layout: 3 entries a layer (gate, up, down, named as the tensors),
/// each with ncall 1 and n_expert x columns values, then the layer batches seen and the dataset path.
/// The statistics themselves are checked against transformers in hf_forward.rs.
#[test]
fn imatrix_collects_over_the_dataset_and_writes_the_dat() {
    let dir = std::env::temp_dir().join(format!("ds4-imatrix-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let ds = dir.join("d.txt");
    std::fs::write(&ds, "===== DS4_IMATRIX_PROMPT 1\nHello there, how are you?\n===== DS4_IMATRIX_PROMPT 2\nQuel ramo del lago di Como\n===== DS4_IMATRIX_PROMPT 3\nthird\n").unwrap();
    let out = dir.join("i.dat");
    let (d, o) = (ds.to_str().unwrap(), out.to_str().unwrap());
    let r = ds4().args(["--cpu", "--imatrix-dataset", d, "--imatrix-out", o, "--imatrix-max-prompts", "2"]).output().unwrap();
    let err = String::from_utf8_lossy(&r.stderr);
    assert!(r.status.success(), "{err}");
    assert!(err.contains("from 2 prompts"), "{err}");
    let model = ds4_engine::resolve_model(None).unwrap().path().to_path_buf();
    let cfg = ds4_model::Config::from_gguf(&ds4_gguf::GgufFile::open(&model).unwrap()).unwrap();
    let b = std::fs::read(&out).unwrap();
    let i = |at: usize| i32::from_le_bytes(b[at..at + 4].try_into().unwrap()) as usize;
    assert_eq!(i(0), 3 * cfg.n_layer);
    let mut at = 4;
    for il in 0..cfg.n_layer {
        for (m, cols) in [("gate", cfg.n_embd), ("up", cfg.n_embd), ("down", cfg.ff_exp)] {
            let name = format!("blk.{il}.ffn_{m}_exps.weight");
            assert_eq!(&b[at + 4..at + 4 + i(at)], name.as_bytes());
            at += 4 + i(at);
            assert_eq!((i(at), i(at + 4)), (1, cfg.n_expert * cols), "{name}");
            at += 8 + 4 * cfg.n_expert * cols;
        }
    }
    assert_eq!(i(at), 2 * cfg.n_layer, "one layer batch per layer and prompt (short prompts: one chunk each)");
    assert_eq!(&b[at + 8..], d.as_bytes());
    assert_eq!(i(at + 4), d.len());
    // A token budget stops inside a prompt.
    let r = ds4().args(["--cpu", "--imatrix-dataset", d, "--imatrix-out", o, "--imatrix-max-tokens", "5"]).output().unwrap();
    assert!(String::from_utf8_lossy(&r.stderr).contains("from 1 prompts, 5 tokens"), "{}", String::from_utf8_lossy(&r.stderr));
    // Usage errors before loading: one flag without the other, with a prompt.
    for args in [&["--imatrix-out", o][..], &["--imatrix-dataset", d], &["--imatrix-dataset", d, "--imatrix-out", o, "-p", "x"]] {
        let r = ds4().args(args).output().unwrap();
        assert_eq!(r.status.code(), Some(2), "{args:?}: {}", String::from_utf8_lossy(&r.stderr));
    }
    let _ = std::fs::remove_dir_all(&dir);
}
