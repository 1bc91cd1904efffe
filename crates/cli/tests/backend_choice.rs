//! `--backend` and ds4's backend switches as a user types them: a backend this binary was not built
//! with exits 2 with one line naming the cargo feature to build with; bad values and two backends at
//! once are usage errors (exit 2); `auto` never runs on a CPU-type Vulkan adapter (lavapipe).
use std::process::{Command, Output};

fn ds4(args: &[&str]) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_ds4"));
    // lavapipe's window-system code complains without it.
    if std::env::var_os("XDG_RUNTIME_DIR").is_none() {
        c.env("XDG_RUNTIME_DIR", std::env::temp_dir());
    }
    c.args(args).output().unwrap()
}

fn bench(args: &[&str]) -> Output { Command::new(env!("CARGO_BIN_EXE_ds4-bench")).args(args).output().unwrap() }

fn stderr(o: &Output) -> String { String::from_utf8_lossy(&o.stderr).into_owned() }

/// Exit 2 with exactly one line on stderr containing `want`.
fn assert_usage(args: &[&str], o: &Output, want: &str) {
    let e = stderr(o);
    assert_eq!(o.status.code(), Some(2), "{args:?}: {e}");
    assert_eq!(e.trim().lines().count(), 1, "{args:?}: one line: {e}");
    assert!(e.contains(want), "{args:?}: says {want:?}: {e}");
}

#[test]
fn wgpu_backends_without_the_feature_name_the_cargo_feature() {
    if cfg!(feature = "wgpu") {
        return;
    }
    for args in [&["--vulkan"][..], &["--metal"], &["--backend", "vulkan"], &["--backend", "metal"], &["--backend", "wgpu"]] {
        let mut a = args.to_vec();
        a.extend(["-p", "Hi", "-n", "1"]);
        let o = ds4(&a);
        assert_usage(&a, &o, "--features wgpu");
        assert!(stderr(&o).starts_with(&format!("ds4: {}", args[0])), "names the flag as given: {}", stderr(&o));
    }
    let a = ["--vulkan", "--prompt-file", "/nonexistent.txt"];
    assert_usage(&a, &bench(&a), "--features wgpu");
}

#[test]
fn metal_outside_apple_is_refused_in_a_wgpu_build() {
    if !cfg!(feature = "wgpu") || cfg!(target_vendor = "apple") {
        return;
    }
    let a = ["--metal", "-p", "Hi", "-n", "1"];
    assert_usage(&a, &ds4(&a), "Apple");
}

#[test]
fn bad_backend_values_and_conflicts_are_usage_errors() {
    let a = ["--backend", "opencl", "-p", "Hi", "-n", "1"];
    assert_usage(&a, &ds4(&a), "unknown backend");
    for a in [&["--cpu", "--vulkan"][..], &["--vulkan", "--metal"], &["--cuda", "--vulkan"], &["--vulkan", "--backend", "cpu"]] {
        let mut a = a.to_vec();
        a.extend(["-p", "Hi", "-n", "1"]);
        let o = ds4(&a);
        assert_eq!(o.status.code(), Some(2), "{a:?}: {}", stderr(&o));
        assert!(stderr(&o).contains("cannot be used with"), "{a:?}: {}", stderr(&o));
    }
}

#[test]
fn auto_runs_on_the_cpu_over_a_cpu_type_adapter() {
    // With lavapipe the only adapter (CI), or no adapter at all, `auto` is the CPU backend: same
    // greedy text as --backend cpu, and no device line.
    if ds4_engine::probe_wgpu() == Some(ds4_engine::AdapterKind::Gpu) || (cfg!(feature = "cuda") && ds4_engine::Backend::auto() == ds4_engine::Backend::Cuda) {
        return;
    }
    let run = |b: &str| ds4(&["--backend", b, "-p", "Ciao", "-n", "8", "--temp", "0", "--ctx", "512"]);
    let (auto, cpu) = (run("auto"), run("cpu"));
    assert!(auto.status.success(), "{}", stderr(&auto));
    assert_eq!(auto.stdout, cpu.stdout);
    assert!(!stderr(&auto).contains("accelerator:"), "no device plan on the CPU: {}", stderr(&auto));
}
