//! What the MTP tests share: tiny model + MTP files, an engine on a chosen backend, test samplers
//! (an oracle that proposes chosen drafts, greedy over the block's own drafts), two-turn plain and
//! speculative generation.
#![allow(dead_code)]
#[cfg(any(feature = "wgpu", feature = "cuda"))]
pub mod drafter;
use ds4_engine::speculative::SpecSampler;
use ds4_engine::{Backend, Engine, GenStats, LoadOptions, MtpOptions, ScriptedDrafts, Session, StopReason};
use ds4_model::synth::{self, Mix, SynthSpec};
use ds4_tokenizer::sampling::argmax;
use std::cell::Cell;
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::atomic::AtomicBool;

pub const CTX: usize = 1024;

/// A tiny model and its MTP file (written once per test binary run).
pub fn files(mix: Mix, tag: &str) -> (PathBuf, PathBuf) {
    let dir = std::env::temp_dir().join(format!("ds4-mtp-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (m, t) = (dir.join(format!("tiny-{tag}.gguf")), dir.join(format!("tiny-{tag}-mtp.gguf")));
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _g = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    if !m.exists() {
        let spec = SynthSpec { shape: "tiny", mix, seed: 7, layers: None, vocab: None };
        synth::write(&spec, &m, |_, _| {}).unwrap();
        synth::write_mtp(&spec, &t, |_, _| {}).unwrap();
    }
    (m, t)
}

pub fn load(model: &PathBuf, mtp: Option<MtpOptions>, chunk: usize) -> Engine {
    load_on(model, mtp, chunk, Backend::Cpu)
}

pub fn load_on(model: &PathBuf, mtp: Option<MtpOptions>, chunk: usize, backend: Backend) -> Engine {
    load_with(model, mtp, chunk, backend, ds4_model::Options::default())
}

pub fn load_with(model: &PathBuf, mtp: Option<MtpOptions>, chunk: usize, backend: Backend, options: ds4_model::Options) -> Engine {
    let opts = LoadOptions { ctx: CTX, prefill_chunk: chunk, quiet: true, mtp, backend, options, ..LoadOptions::default() };
    Engine::load(model, &opts).unwrap()
}

pub fn tokens(n: usize, seed: u64, vocab: usize) -> Vec<u32> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((s >> 33) % vocab as u64) as u32
        })
        .collect()
}

/// Drafts (a `ScriptedDrafts`) that propose the true next token of `truth` (the plain greedy tokens)
/// ~70 % of the time and a wrong one otherwise (a stream seeded by `seed`): accepted prefixes of every
/// length, rejections at every depth. The counter of emitted tokens is shared with the caller.
pub fn right_seven_in_ten(truth: Vec<u32>, vocab: usize, seed: u64) -> (ScriptedDrafts, Rc<Cell<usize>>) {
    let mut x = seed;
    ScriptedDrafts::new(move |n: usize| {
        x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        let t = truth.get(n).copied().unwrap_or(0);
        if (x >> 33) % 10 < 7 { t } else { (t + 1) % vocab as u32 }
    })
}

/// Greedy with the MTP block's own proposals.
pub struct Greedy;
impl SpecSampler for Greedy {
    fn pick(&mut self, l: &[f32]) -> u32 { argmax(l) }
    fn target(&mut self, l: &[f32], out: &mut Vec<(u32, f32)>) {
        out.clear();
        out.push((argmax(l), 1.0));
    }
    fn uniform(&mut self) -> f64 { 0.5 }
    fn greedy(&self) -> bool { true }
}

/// Two turns: prompt, `n` tokens, the history plus `extra`, `n` more tokens (prefill in chunks).
pub fn plain_turns(eng: &mut Engine, prompt: &[u32], extra: &[u32], n: usize) -> Vec<Vec<u32>> {
    let mut s = Session::new(eng);
    let mut out = Vec::new();
    let mut history = prompt.to_vec();
    for turn in 0..2 {
        if turn == 1 {
            history.extend_from_slice(extra);
        }
        s.sync(eng, &history, &mut |_, _| {}, &AtomicBool::new(false)).unwrap();
        let mut got = Vec::new();
        let mut st = GenStats::default();
        let r = s.generate(eng, n, None, true, &mut |l| argmax(l), &mut |t| { got.push(t); true }, &AtomicBool::new(false), &mut st).unwrap();
        assert_eq!(r, StopReason::MaxTokens);
        history.extend_from_slice(&got);
        assert_eq!(s.tokens, history);
        out.push(got);
    }
    out
}

pub fn spec_turns(eng: &mut Engine, prompt: &[u32], extra: &[u32], n: usize, sampler: &mut dyn SpecSampler, emitted: &Rc<Cell<usize>>, stats: &mut GenStats) -> Vec<Vec<u32>> {
    let mut s = Session::new(eng);
    assert!(s.speculative());
    let mut out = Vec::new();
    let mut history = prompt.to_vec();
    for turn in 0..2 {
        if turn == 1 {
            history.extend_from_slice(extra);
        }
        s.sync(eng, &history, &mut |_, _| {}, &AtomicBool::new(false)).unwrap();
        let mut got = Vec::new();
        let e = emitted.clone();
        let base = e.get();
        let r = s
            .generate_speculative(eng, n, None, sampler, &mut |t| { got.push(t); e.set(base + got.len()); true }, &AtomicBool::new(false), stats)
            .unwrap();
        assert_eq!(r, StopReason::MaxTokens);
        history.extend_from_slice(&got);
        assert_eq!(s.tokens, history, "the session holds exactly the emitted tokens");
        out.push(got);
    }
    out
}


/// The next `n` greedy tokens after `prompt` in a fresh session: with MTP speculation (the greedy
/// sampler verifying the drafts) or plain.
pub fn greedy_after(eng: &mut Engine, prompt: &[u32], n: usize, spec: bool, st: &mut GenStats) -> Vec<u32> {
    use ds4_tokenizer::sampling::{Sampler, SamplerConfig};
    let mut s = Session::new(eng);
    s.sync(eng, prompt, &mut |_, _| {}, &AtomicBool::new(false)).unwrap();
    let mut out = Vec::new();
    let mut g = Sampler::new(SamplerConfig::greedy());
    if spec {
        s.generate_speculative(eng, n, None, &mut g as &mut dyn SpecSampler, &mut |t| { out.push(t); true }, &AtomicBool::new(false), st).unwrap();
    } else {
        s.generate(eng, n, None, true, &mut |l| argmax(l), &mut |t| { out.push(t); true }, &AtomicBool::new(false), st).unwrap();
    }
    out
}
