//! The wgpu backend on the trained copy-task model (`tools/reference/trained_tiny.py`, a realistic
//! logit distribution with clear margins; `--features wgpu`, lavapipe in CI): greedy continuations
//! equal transformers' reference continuations and the CPU backend's (its default int8 fast path)
//! for 32 tokens; the trained MTP drafter is accepted on the device and leaves greedy unchanged.
#![cfg(feature = "wgpu")]
use ds4_engine::speculative::SpecSampler;
use ds4_engine::{Backend, Engine, GenStats, LoadOptions, MtpOptions, Session};
use ds4_tokenizer::sampling::argmax;
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;

fn fixture() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../dist/tests/fixtures/copy_task")
}

fn ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()
}

fn load(backend: Backend, mtp: Option<MtpOptions>) -> Engine {
    if std::env::var_os("XDG_RUNTIME_DIR").is_none() {
        std::env::set_var("XDG_RUNTIME_DIR", std::env::temp_dir());
    }
    let opts = LoadOptions { ctx: 256, prefill_chunk: 8, quiet: true, backend, mtp, ..LoadOptions::default() };
    Engine::load(&fixture().join("copy_q4.gguf"), &opts).unwrap()
}

/// Greedy sampler over the MTP block's own drafts.
struct Greedy;
impl SpecSampler for Greedy {
    fn pick(&mut self, l: &[f32]) -> u32 {
        argmax(l)
    }
    fn target(&mut self, l: &[f32], out: &mut Vec<(u32, f32)>) {
        out.clear();
        out.push((argmax(l), 1.0));
    }
    fn uniform(&mut self) -> f64 {
        0.5
    }
}

fn greedy(eng: &mut Engine, prompt: &[u32], n: usize, mtp: bool, st: &mut GenStats) -> Vec<u32> {
    let mut s = Session::new(eng);
    s.sync(eng, prompt, &mut |_, _| {}, &AtomicBool::new(false)).unwrap();
    let mut got = Vec::new();
    let never = AtomicBool::new(false);
    if mtp {
        s.generate_speculative(eng, n, None, &mut Greedy, &mut |t| { got.push(t); true }, &never, st).unwrap();
    } else {
        s.generate(eng, n, None, true, &mut |l| argmax(l), &mut |t| { got.push(t); true }, &never, st).unwrap();
    }
    got
}

#[test]
fn vulkan_greedy_equals_transformers_and_the_cpu_and_mtp_keeps_it() {
    let r: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(fixture().join("reference.json")).unwrap()).unwrap();
    let mut cpu = load(Backend::Cpu, None);
    let mut gpu = load(Backend::Vulkan, None);
    let mut spec = load(Backend::Vulkan, Some(MtpOptions { path: fixture().join("copy_mtp.gguf"), draft: 2, margin: 0.0 }));
    let mut st = GenStats::default();
    let prompts = r["prompts"].as_array().unwrap();
    for p in prompts.iter().take(2) {
        let (prompt, want) = (ids(&p["prompt"]), ids(&p["continuation"]));
        let g = greedy(&mut gpu, &prompt, 32, false, &mut GenStats::default());
        assert_eq!(g[..want.len()], want[..], "vulkan vs transformers on {prompt:?}");
        let c = greedy(&mut cpu, &prompt, 32, false, &mut GenStats::default());
        assert_eq!(g, c, "vulkan vs cpu, 32 greedy tokens after {prompt:?}");
        let s = greedy(&mut spec, &prompt, 32, true, &mut st);
        assert_eq!(s, g, "vulkan with MTP vs without, after {prompt:?}");
    }
    eprintln!("vulkan MTP draft 2 on the trained drafter: drafted {} accepted {} ({:.2})", st.drafted, st.accepted, st.acceptance());
    assert!(st.acceptance() > 0.5, "{st:?}");
}
