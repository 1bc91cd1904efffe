//! Values and paths an outside tester passes that used to crash, hang or fail only after the work was
//! done: each is refused before any weight is read (exit 2, a message naming the flag), and the
//! interactive `/ctx N` is admitted by the memory plan like `--ctx N`.
use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

fn ds4() -> Command { Command::new(env!("CARGO_BIN_EXE_ds4")) }
fn bench() -> Command { Command::new(env!("CARGO_BIN_EXE_ds4-bench")) }
fn stderr(o: &Output) -> String { String::from_utf8_lossy(&o.stderr).into_owned() }

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("ds4-outside-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Runs `c` with `input` on stdin; kills it after `limit` (a hang is a failure, not a stuck test).
fn run(mut c: Command, args: &[&str], input: &str, limit: Duration) -> Output {
    let mut child = c.args(args).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    child.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
    wait_within(child, args, limit)
}

/// Waits for `child`; kills it and fails after `limit`.
fn wait_within(mut child: std::process::Child, args: &[&str], limit: Duration) -> Output {
    let t0 = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if t0.elapsed() > limit {
            let _ = child.kill();
            let o = child.wait_with_output().unwrap();
            panic!("{args:?} still running after {limit:?}: {}", stderr(&o));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

/// Exit 2 with a message containing `needle`, before the memory plan (so before any weight is read).
fn refused_before_loading(o: &Output, args: &[&str], needle: &str) {
    let e = stderr(o);
    assert_eq!(o.status.code(), Some(2), "{args:?}: {e}");
    assert!(e.contains(needle), "{args:?}: {e}");
    assert!(!e.contains("memory: ") && !e.contains("panicked"), "{args:?}: refused before planning: {e}");
}

/// Each case (arguments, message) run through `bin` is refused before loading.
fn each_refused_before_loading(bin: fn() -> Command, cases: &[(&[&str], &str)]) {
    for &(args, needle) in cases {
        let o = run(bin(), args, "", Duration::from_secs(60));
        refused_before_loading(&o, args, needle);
    }
}

/// A prompt file for ds4-bench in `d` (a few hundred tokens).
fn bench_prompt(d: &std::path::Path) -> PathBuf {
    let prompt = d.join("p.txt");
    std::fs::write(&prompt, "Quel ramo del lago di Como ".repeat(20)).unwrap();
    prompt
}

#[test]
fn sizes_that_overflowed_the_plan_or_hung_are_usage_errors() {
    // --ctx 2^64-1 and --prefill-chunk 2^62 wrapped the plan to a few MiB, then panicked on the
    // allocation; --threads 100000 spawned threads for minutes; --temp inf sampled uniformly.
    each_refused_before_loading(
        ds4,
        &[
            (&["-p", "x", "--ctx", "18446744073709551615"][..], "--ctx"),
            (&["-p", "x", "--prefill-chunk", "4611686018427387904"], "--prefill-chunk"),
            (&["-p", "x", "--threads", "100000"], "--threads"),
            (&["-p", "x", "--temp", "inf"], "--temp"),
        ],
    );
}

#[test]
fn output_files_are_checked_before_the_generation() {
    // A directory, a missing directory or a FIFO given for an output file failed (or, for --kv-save on a
    // device, silently replaced it with a regular file) only after the whole generation.
    let d = scratch("out");
    let dir = d.to_str().unwrap();
    let missing = d.join("no/such/dir/f.json");
    let missing = missing.to_str().unwrap();
    each_refused_before_loading(
        ds4,
        &[
            (&["-p", "x", "-n", "2", "--kv-save", dir][..], "--kv-save"),
            (&["-p", "x", "-n", "2", "--kv-save", missing], "does not exist"),
            (&["-p", "x", "-n", "2", "--dump-logprobs", dir], "--dump-logprobs"),
            (&["-p", "x", "-n", "2", "--dump-logprobs", missing], "does not exist"),
            (&["-p", "x", "--dump-logits", dir], "--dump-logits"),
        ],
    );
    let fifo = d.join("fifo.kv");
    if Command::new("mkfifo").arg(&fifo).status().is_ok_and(|s| s.success()) {
        let args = ["-p", "x", "-n", "2", "--kv-save", fifo.to_str().unwrap()];
        let o = run(ds4(), &args, "", Duration::from_secs(60));
        refused_before_loading(&o, &args, "not a regular file");
        use std::os::unix::fs::FileTypeExt;
        assert!(std::fs::symlink_metadata(&fifo).unwrap().file_type().is_fifo(), "the FIFO was replaced");
    }
    // A device written in place (not renamed over) stays fine for the JSON outputs.
    let o = run(ds4(), &["-p", "x", "--dump-logits", "/dev/null"], "", Duration::from_secs(60));
    assert!(o.status.success(), "{}", stderr(&o));
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn interactive_ctx_is_admitted_by_the_memory_plan() {
    // `/ctx 100000000` allocated the KV state unchecked (48 GiB for the tiny model) and aborted the
    // process; now it is refused like `--ctx 100000000` over the budget, and the chat goes on.
    let d = scratch("ctx");
    let mut c = ds4();
    c.env("DS4_HISTORY", d.join("history"));
    let input = "/ctx 100000000\n/ctx 18446744073709551615\n/ctx 64\nhello\n/read\n/quit\n";
    let o = run(c, &["--cpu", "--mem-limit-gb", "1", "-n", "2", "--temp", "0"], input, Duration::from_secs(120));
    let e = stderr(&o);
    assert!(o.status.success(), "{e}");
    assert!(e.contains("/ctx 100000000: memory plan") && e.contains("exceeds the budget") && e.contains("the context stays 32768 tokens"), "{e}");
    assert!(e.contains("/ctx 18446744073709551615: a context is at most"), "{e}");
    let set = e.find("context set to 64 tokens").expect("a context that fits is set");
    assert!(e[set..].lines().nth(1).is_some_and(|l| l.starts_with("memory: ")), "the new plan is shown: {e}");
    assert!(e.contains("generated: 2 tokens"), "{e}");
    assert!(e.contains("usage: /read FILE"), "{e}");
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn bench_sizes_that_wrapped_or_exhausted_memory_are_usage_errors() {
    // --ctx-max 2^64-1 made --ctx-max + --gen-tokens + 1 wrap to a tiny context, then the frontier list
    // and the token list ran out of memory (abort); -n 2^64-1 wrapped to a context that silently cut the
    // decode short; --concurrency 2^64-1 overflowed the plan (panic).
    let d = scratch("bench");
    let prompt = bench_prompt(&d);
    let p = prompt.to_str().unwrap();
    let dir = d.to_str().unwrap();
    each_refused_before_loading(
        bench,
        &[
            (&["--prompt-file", p, "--ctx-start", "64", "--ctx-max", "18446744073709551615", "-n", "4"][..], "--ctx-max"),
            (&["--prompt-file", p, "--ctx-start", "64", "--ctx-max", "128", "-n", "18446744073709551615"], "--gen-tokens"),
            (
                &["--prompt-file", p, "--ctx-start", "64", "--ctx-max", "128", "-n", "4", "--concurrency", "18446744073709551615"],
                "--concurrency",
            ),
            (&["--prompt-file", p, "--ctx-start", "1", "--ctx-max", "100000000", "--step-incr", "1", "-n", "1"], "frontiers"),
            (&["--prompt-file", p, "--ctx-start", "64", "--ctx-max", "128", "-n", "4", "--csv", dir], "--csv"),
            // Bad values are usage errors (exit 2) like the rest, not run failures (exit 1).
            (&["--prompt-file", p, "--ctx-start", "64", "--ctx-max", "128", "-n", "4", "--prefill-chunk", "0"], "--prefill-chunk"),
            (&["--prompt-file", p, "--ctx-start", "256", "--ctx-max", "128", "-n", "4"], "--ctx-start"),
        ],
    );
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn negative_values_get_the_range_message_not_an_unknown_argument() {
    // `--temp -1`, `--top-p -0.1`, `--mem-limit-gb -1` were read as unknown options ("unexpected
    // argument '-0' found"), hiding the range the value must be in; `--gpu-bw-gbps 0` or NaN was
    // accepted and divided by.
    each_refused_before_loading(
        ds4,
        &[
            (&["-p", "x", "--temp", "-1"][..], "--temp must be a number >= 0"),
            (&["-p", "x", "--top-p", "-0.1"], "--top-p and --min-p within [0, 1]"),
            (&["-p", "x", "--min-p", "-1"], "--top-p and --min-p within [0, 1]"),
            (&["-p", "x", "--mem-limit-gb", "-1"], "--mem-limit-gb must be a positive number"),
            (&["-p", "x", "-n", "-1"], "invalid value '-1' for '--tokens"),
            (&["-p", "x", "--ctx", "-5"], "invalid value '-5' for '--ctx"),
        ],
    );
    let d = scratch("negative");
    let prompt = bench_prompt(&d);
    let p = prompt.to_str().unwrap();
    each_refused_before_loading(
        bench,
        &[
            (&["--prompt-file", p, "--ctx-start", "64", "--ctx-max", "128", "--step-mul", "-2"][..], "--step-mul must be 1"),
            (&["--prompt-file", p, "--ctx-start", "64", "--ctx-max", "128", "--gpu-bw-gbps", "0"], "--gpu-bw-gbps must be a positive"),
            (
                &["--prompt-file", p, "--ctx-start", "64", "--ctx-max", "128", "--gpu-bw-gbps", "NaN"],
                "--gpu-bw-gbps must be a positive",
            ),
            (&["--prompt-file", p, "--ctx-start", "-1", "--ctx-max", "128"], "invalid value '-1' for '--ctx-start"),
        ],
    );
    let _ = std::fs::remove_dir_all(&d);
}

/// Runs `c` with stdout on `out` (stdin closed), killed after `limit`.
fn run_to(mut c: Command, args: &[&str], out: Stdio, limit: Duration) -> Output {
    let child = c.args(args).stdin(Stdio::null()).stdout(out).stderr(Stdio::piped()).spawn().unwrap();
    wait_within(child, args, limit)
}

#[cfg(target_os = "linux")]
#[test]
fn a_failed_stdout_write_is_an_error_not_a_panic_or_a_silent_success() {
    // With stdout on a full disk, the answer was lost and ds4 exited 0; --dump-tokens, --inspect,
    // --perplexity-file and --decode-consistency panicked (exit 101). ds4-bench's error named no file.
    let d = scratch("full");
    let text = d.join("t.txt");
    std::fs::write(&text, "Quel ramo del lago di Como").unwrap();
    let t = text.to_str().unwrap();
    for args in [
        &["-p", "x", "-n", "4", "--temp", "0"][..],
        &["-p", "x", "-n", "2", "--logprobs-top-k", "2"],
        &["--dump-tokens", "-p", "x"],
        &["--inspect"],
        &["--perplexity-file", t],
        &["--decode-consistency", "2", "-p", "x"],
    ] {
        let full = std::fs::OpenOptions::new().write(true).open("/dev/full").unwrap();
        let o = run_to(ds4(), args, full.into(), Duration::from_secs(60));
        let e = stderr(&o);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {e}");
        assert!(e.contains("cannot write") && e.contains("No space left") && !e.contains("panicked"), "{args:?}: {e}");
    }
    let full = std::fs::OpenOptions::new().write(true).open("/dev/full").unwrap();
    let args = ["--prompt-file", t, "--ctx-start", "8", "--ctx-max", "16", "-n", "1", "--csv", "/dev/full"];
    let o = run_to(bench(), &args, full.into(), Duration::from_secs(60));
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("cannot write the CSV to /dev/full"), "{}", stderr(&o));
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn a_closed_stdout_pipe_stops_the_generation() {
    // `ds4 -p ... | head -c 1`: the answer went on being generated (to the full --ctx) after the reader
    // had gone. Now the generation stops at the first failed write; a closed pipe is not an error.
    let mut child = ds4()
        .args(["-p", "x", "-n", "1000000", "--temp", "0", "--ctx", "32768"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let t0 = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if t0.elapsed() > Duration::from_secs(20) {
            let _ = child.kill();
            let o = child.wait_with_output().unwrap();
            panic!("still generating with no reader after 20 s: {}", stderr(&o));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let o = child.wait_with_output().unwrap();
    let e = stderr(&o);
    assert!(o.status.success(), "{e}");
    assert!(!e.contains("the context (--ctx 32768) is full") && !e.contains("panicked"), "{e}");
}

#[test]
fn gguf_split_refuses_to_overwrite_its_input() {
    // `ds4-gguf split --layers 0:2 model.gguf model.gguf` replaced the whole model by a 3-layer shard.
    let d = scratch("split");
    let m = d.join("tiny.gguf");
    let gguf = || Command::new(env!("CARGO_BIN_EXE_ds4-gguf"));
    assert!(gguf().args(["synth", "tiny"]).arg(&m).output().unwrap().status.success());
    let before = std::fs::metadata(&m).unwrap().len();
    let same = d.join(".").join("tiny.gguf");
    let o = gguf().args(["split", "--layers", "0:2"]).arg(&m).arg(&same).output().unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("is the input file"), "{}", stderr(&o));
    assert_eq!(std::fs::metadata(&m).unwrap().len(), before, "the model is untouched");
    let o = gguf().args(["split", "--layers", "0:2"]).arg(&m).arg(d.join("shard.gguf")).output().unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let _ = std::fs::remove_dir_all(&d);
}
