//! Admission by the memory plan: a 20k-token prompt completes on a budget just above the plan, and a
//! budget just below it refuses at startup with the message (seed 003: no OOM half-way through).
use std::process::Command;

fn bench(budget: Option<f64>) -> std::process::Output {
    let prompt = std::env::temp_dir().join(format!("ds4-memplan-{}.txt", std::process::id()));
    if !prompt.exists() {
        let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../../shared/data/promessi_sposi.txt"))
            .unwrap_or_else(|_| "Quel ramo del lago di Como, che volge a mezzogiorno. ".repeat(2000));
        std::fs::write(&prompt, text).unwrap();
    }
    let mut c = Command::new(env!("CARGO_BIN_EXE_ds4-bench"));
    c.args(["--prompt-file", prompt.to_str().unwrap(), "--ctx-start", "20000", "--ctx-max", "20000", "--gen-tokens", "2"]);
    c.args(["--prefill-chunk", "512"]);
    if let Some(b) = budget {
        c.args(["--mem-limit-gb", &format!("{b}")]);
    }
    c.output().unwrap()
}

fn planned_gib(stderr: &str) -> f64 {
    let line = stderr.lines().find(|l| l.starts_with("memory: ")).expect("plan line");
    let t = line.split(" = ").nth(1).unwrap();
    t.split_whitespace().next().unwrap().parse().unwrap()
}

#[test]
#[ignore = "20k-token prefill: about a minute on 2 cores; run with --ignored"]
fn long_prompt_fits_a_budget_just_above_the_plan() {
    let probe = bench(Some(1000.0));
    let err = String::from_utf8_lossy(&probe.stderr);
    assert!(probe.status.success(), "{err}");
    let plan = planned_gib(&err);
    // The plan line rounds to 0.01 GiB: budget = plan + 0.01 GiB is "just above".
    let ok = bench(Some(plan + 0.01));
    let out = String::from_utf8_lossy(&ok.stdout);
    assert!(ok.status.success(), "{}", String::from_utf8_lossy(&ok.stderr));
    let row = out.lines().nth(1).expect("csv row");
    assert!(row.starts_with("20000,20000,"), "{row}");
    let refused = bench(Some((plan - 0.01).max(0.001)));
    let err = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(1), "{err}");
    assert!(err.contains("exceeds the budget") && err.contains("--prefill-chunk"), "{err}");
    assert!(refused.stdout.is_empty(), "must refuse before any work");
}

fn ds4(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_ds4")).args(args).output().unwrap()
}

/// The line the load prints when it starts reading weights (stderr is not a terminal here).
const LOADING: &str = "loading weights";

#[test]
fn over_budget_refuses_before_loading_with_a_limit_that_fits() {
    let out = ds4(&["--mem-limit-gb", "0.000001", "-p", "Hi", "-n", "1"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("exceeds the budget") && err.contains("would fit:") && err.contains("--mem-limit-gb"), "{err}");
    assert!(!err.contains(LOADING), "weights were loaded before the refusal: {err}");
    assert!(out.stdout.is_empty());
}

#[test]
fn a_prompt_longer_than_the_context_is_refused_before_loading() {
    let long = "the quick brown fox jumps over the lazy dog ".repeat(40);
    let out = ds4(&["--ctx", "64", "-p", &long, "-n", "1"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("does not fit --ctx 64"), "{err}");
    assert!(!err.contains(LOADING), "weights were loaded before the refusal: {err}");
    // Far longer than any token count could fit: refused from its length, without tokenizing.
    let huge = std::env::temp_dir().join(format!("ds4-huge-prompt-{}.txt", std::process::id()));
    std::fs::write(&huge, "x".repeat(4 << 20)).unwrap();
    let out = ds4(&["--ctx", "64", "--prompt-file", huge.to_str().unwrap(), "-n", "1"]);
    std::fs::remove_file(&huge).unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("at least") && err.contains("does not fit --ctx 64") && !err.contains(LOADING), "{err}");
}

#[test]
fn bad_load_flags_are_usage_errors() {
    for args in [&["--weights", "mlock", "-p", "Hi"][..], &["--threads", "0", "-p", "Hi"], &["--mem-limit-gb", "-2", "-p", "Hi"]] {
        let out = ds4(args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(!err.contains(LOADING), "{err}");
    }
}

#[test]
fn weight_modes_load_and_say_what_they_read() {
    let run = |extra: &[&str]| {
        let mut a = vec!["-p", "Hi", "-n", "3", "--temp", "0"];
        a.extend_from_slice(extra);
        let out = ds4(&a);
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "{extra:?}: {err}");
        (String::from_utf8_lossy(&out.stdout).into_owned(), err)
    };
    let (copy, err) = run(&[]);
    assert!(err.contains("(copy)") && err.contains("loading weights (copy):") && err.contains("done in"), "{err}");
    let (mapped, err) = run(&["--weights", "mmap"]);
    assert!(err.contains("mapping weights (mmap") && !err.contains("done in"), "{err}");
    let (warm, err) = run(&["--weights", "mmap", "--warm-weights"]);
    assert!(err.contains("warming weights (mmap):") && err.contains("done in"), "{err}");
    // Where the weights live does not change what the model computes.
    assert_eq!(copy, mapped);
    assert_eq!(copy, warm);
}

/// `synth flash:1 --mix q2` (3.3 GiB): `DS4_FLASH1`, else made once in the temp directory.
fn flash1() -> std::path::PathBuf {
    if let Some(p) = std::env::var_os("DS4_FLASH1") {
        return p.into();
    }
    let p = std::env::temp_dir().join("ds4-test-flash1-q2.gguf");
    if !p.exists() {
        let tmp = p.with_extension("partial");
        let st = Command::new(env!("CARGO_BIN_EXE_ds4-gguf")).args(["synth", "flash:1", tmp.to_str().unwrap(), "--mix", "q2"]).status().unwrap();
        assert!(st.success());
        std::fs::rename(&tmp, &p).unwrap();
    }
    p
}

/// Peak RSS (KiB) and wall seconds of a ds4 run, measured by `/usr/bin/time` (GNU time).
fn timed(args: &[&str]) -> (std::process::Output, u64, f64) {
    let out = Command::new("/usr/bin/time").args(["-f", "TIME %M %e", env!("CARGO_BIN_EXE_ds4")]).args(args).output().expect("needs GNU time in /usr/bin/time");
    let err = String::from_utf8_lossy(&out.stderr);
    let line = err.lines().rfind(|l| l.starts_with("TIME ")).unwrap_or_else(|| panic!("no time line: {err}"));
    let mut f = line.split_whitespace().skip(1);
    let rss = f.next().unwrap().parse().unwrap();
    let secs = f.next().unwrap().parse().unwrap();
    (out, rss, secs)
}

#[test]
#[ignore = "makes and loads a 3.3 GiB model; run with --ignored (DS4_FLASH1=path reuses one)"]
fn flash1_over_budget_exits_fast_and_small_and_runs_with_the_default_budget() {
    let model = flash1();
    let m = model.to_str().unwrap();
    let (out, rss_kib, secs) = timed(&["-m", m, "--mem-limit-gb", "1", "-p", "Hi"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("exceeds the budget"), "{err}");
    assert!(secs < 3.0, "refusal took {secs} s");
    assert!(rss_kib < 300 * 1000, "peak RSS {rss_kib} KiB");
    // A prompt over the context: refused after tokenizing (the tokenizer comes from the metadata).
    let long = "the quick brown fox jumps over the lazy dog ".repeat(400);
    let (out, rss_kib, secs) = timed(&["-m", m, "--ctx", "256", "-p", &long]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("does not fit --ctx 256"), "{err}");
    assert!(secs < 3.0 && rss_kib < 300 * 1000, "prompt refusal took {secs} s, peak RSS {rss_kib} KiB");
    let (out, rss_kib, _) = timed(&["-m", m, "-p", "Hi", "-n", "2", "--temp", "0"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(rss_kib > 3 << 20, "the copy of 3.3 GiB of weights is resident: {rss_kib} KiB");
}
