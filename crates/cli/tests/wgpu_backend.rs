//! End to end on the wgpu backend (`--features wgpu`; lavapipe in CI, `XDG_RUNTIME_DIR` set): `ds4
//! --backend vulkan` prints the same greedy text as `--backend cpu` on the tiny model the other cli
//! tests use (the embedded default, `ds4_engine::resolve_model(None)`). Fails until
//! `ds4_wgpu::WgpuStage` is implemented (its skeleton refuses to load).
#![cfg(feature = "wgpu")]
use std::process::{Command, Output};

fn ds4(args: &[&str]) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_ds4"));
    if std::env::var_os("XDG_RUNTIME_DIR").is_none() {
        c.env("XDG_RUNTIME_DIR", std::env::temp_dir());
    }
    c.args(args).output().unwrap()
}

#[test]
fn vulkan_greedy_text_matches_cpu() {
    let model = ds4_engine::resolve_model(None).unwrap().path().to_str().unwrap().to_string();
    let run = |backend: &str| ds4(&["-m", &model, "--backend", backend, "-p", "Ciao", "-n", "16", "--temp", "0"]);
    let cpu = run("cpu");
    assert!(cpu.status.success(), "cpu: {}", String::from_utf8_lossy(&cpu.stderr));
    let gpu = run("vulkan");
    let err = String::from_utf8_lossy(&gpu.stderr);
    assert!(gpu.status.success(), "vulkan: {err}");
    assert!(!cpu.stdout.is_empty());
    assert_eq!(String::from_utf8_lossy(&gpu.stdout), String::from_utf8_lossy(&cpu.stdout), "vulkan: {err}");
}
