//! The wgpu backend in the engine (`--features wgpu`; lavapipe in CI, `XDG_RUNTIME_DIR` set): the
//! memory plan's device line is the stage's own plan (`ds4_wgpu::plan_bytes`), and a session's KV
//! state survives a download and an upload (what sessions and the disk KV cache do). Fails until
//! `ds4_wgpu::WgpuStage` is implemented (its skeleton refuses to load).
#![cfg(feature = "wgpu")]
use ds4_engine::{resolve_model, Backend, Engine, LoadOptions};
use ds4_model::Logits;

#[test]
fn vulkan_plan_counts_the_stage_device_bytes_and_kv_round_trips() {
    if std::env::var_os("XDG_RUNTIME_DIR").is_none() {
        std::env::set_var("XDG_RUNTIME_DIR", std::env::temp_dir());
    }
    let path = resolve_model(None).unwrap().path().to_path_buf();
    let opts = LoadOptions { ctx: 256, prefill_chunk: 32, backend: Backend::Vulkan, quiet: true, ..LoadOptions::default() };
    let mut eng = Engine::load(&path, &opts).unwrap();
    assert_eq!(eng.backend(), Backend::Vulkan);
    let want = ds4_wgpu::plan_bytes(&eng.stage, opts.ctx, opts.prefill_chunk, eng.range());
    assert!(want > 0);
    assert_eq!(eng.plan.device, want, "the plan's device line is the stage's plan");
    // Prefill, download the state, run on, restore it, and run the same token again: same logits.
    let mut kv = eng.new_kv();
    eng.forward(&mut kv, &[1, 2, 3, 4], None, Logits::Last).unwrap();
    eng.kv_to_host(&mut kv).unwrap();
    let saved = kv.clone();
    let a = eng.forward(&mut kv, &[5], None, Logits::Last).unwrap().to_vec();
    let mut again = saved.clone();
    eng.kv_to_device(&again).unwrap();
    let b = eng.forward(&mut again, &[5], None, Logits::Last).unwrap().to_vec();
    assert_eq!(a, b);
}

/// `--prefill-chunk` not given (`auto_chunk`): the GPU takes the largest chunk that fits (here all of
/// the context's 1024), the engine prefills in chunks of it, and the plan's device line counts it; the
/// CPU keeps the default.
#[test]
fn auto_chunk_takes_the_largest_chunk_the_device_holds() {
    if std::env::var_os("XDG_RUNTIME_DIR").is_none() {
        std::env::set_var("XDG_RUNTIME_DIR", std::env::temp_dir());
    }
    let path = resolve_model(None).unwrap().path().to_path_buf();
    let opts = LoadOptions { ctx: 1024, backend: Backend::Vulkan, quiet: true, ..LoadOptions::default() }.chunk_flag(None);
    assert!(opts.auto_chunk);
    let eng = Engine::load(&path, &opts).unwrap();
    assert_eq!(eng.prefill_chunk, 1024);
    assert_eq!(eng.plan.device, ds4_wgpu::plan_bytes(&eng.stage, 1024, 1024, eng.range()));
    let given = Engine::load(&path, &LoadOptions { backend: Backend::Vulkan, ..opts.clone() }.chunk_flag(Some(64))).unwrap();
    assert_eq!(given.prefill_chunk, 64);
    let cpu = Engine::load(&path, &LoadOptions { backend: Backend::Cpu, ..opts }).unwrap();
    assert_eq!(cpu.prefill_chunk, LoadOptions::default().prefill_chunk);
}
