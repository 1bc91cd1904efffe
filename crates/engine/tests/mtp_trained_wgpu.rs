//! The trained MTP block (`tests/mtp_trained.rs`: the copy-task model and its drafter) drafting on the
//! wgpu device: speculative greedy output equals plain greedy output, and the drafts are accepted as
//! often as the CPU block's (draft 1: every draft). `--features wgpu`, lavapipe in CI.
#![cfg(feature = "wgpu")]
use ds4_engine::{Backend, Engine, GenStats, LoadOptions, MtpOptions};
use std::path::PathBuf;

mod common;
use common::greedy_after;

fn fixture() -> PathBuf { PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../dist/tests/fixtures/copy_task") }

fn ids(v: &serde_json::Value) -> Vec<u32> { v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect() }

fn load(backend: Backend, mtp: Option<MtpOptions>) -> Engine {
    let options = ds4_model::Options { precision: ds4_quant::Precision::Exact, ..Default::default() };
    let opts = LoadOptions { ctx: 256, prefill_chunk: 8, quiet: true, mtp, backend, options, ..LoadOptions::default() };
    Engine::load(&fixture().join("copy_q4.gguf"), &opts).unwrap()
}

/// Greedy tokens of every reference prompt, speculative or plain, and the draft statistics.
fn run(eng: &mut Engine, spec: bool, st: &mut GenStats) -> Vec<Vec<u32>> {
    let r: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(fixture().join("reference.json")).unwrap()).unwrap();
    let mut all = Vec::new();
    for p in r["prompts"].as_array().unwrap() {
        let prompt = ids(&p["prompt"]);
        let out = greedy_after(eng, &prompt, 32, spec, st);
        assert_eq!(out[..16], ids(&p["continuation"])[..16], "the task's continuation");
        all.push(out);
    }
    all
}

#[test]
fn trained_drafts_on_the_device_are_accepted_as_on_the_cpu() {
    if std::env::var_os("XDG_RUNTIME_DIR").is_none() {
        std::env::set_var("XDG_RUNTIME_DIR", std::env::temp_dir());
    }
    let want = run(&mut load(Backend::Vulkan, None), false, &mut GenStats::default());
    for draft in [1, 3] {
        let opts = MtpOptions { path: fixture().join("copy_mtp.gguf"), draft, margin: 0.0 };
        let (mut cpu_st, mut dev_st) = (GenStats::default(), GenStats::default());
        let cpu = run(&mut load(Backend::Cpu, Some(opts.clone())), true, &mut cpu_st);
        let mut dev = load(Backend::Vulkan, Some(opts));
        assert!(dev.mtp.as_ref().unwrap().on_device(), "the wgpu engine drafts on its device");
        let got = run(&mut dev, true, &mut dev_st);
        eprintln!(
            "draft {draft}: device drafted {} accepted {} ({:.3}); CPU drafted {} accepted {} ({:.3})",
            dev_st.drafted,
            dev_st.accepted,
            dev_st.acceptance(),
            cpu_st.drafted,
            cpu_st.accepted,
            cpu_st.acceptance()
        );
        assert_eq!(got, want, "draft {draft}: speculative greedy on the device differs from plain greedy");
        assert_eq!(cpu, want, "draft {draft}: speculative greedy on the CPU differs from plain greedy on the device");
        assert_eq!((dev_st.drafted, dev_st.accepted), (cpu_st.drafted, cpu_st.accepted), "draft {draft}: the device drafter is accepted differently from the CPU block");
        if draft == 1 {
            assert_eq!(dev_st.accepted, dev_st.drafted, "draft 1: the trained block's first draft is always right on this task");
        }
    }
}
