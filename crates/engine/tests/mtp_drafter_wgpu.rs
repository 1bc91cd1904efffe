//! The MTP drafter on the wgpu device (`WgpuStage::mtp_drafter`, `ds4_gpu::GpuMtp`) against the CPU
//! block (`Mtp::forward`, `Precision::Exact`) on tiny q2 and q4 models with a synthetic MTP file: the
//! draft logits of runs of pairs (in one step and in steps of 4), of recursive drafts from the block's
//! own output row, after a rollback of those drafts, and of a run longer than the window (which the
//! device cuts to the window); nothing is allocated, bound or uploaded per draft step. Needs
//! `--features wgpu` and a Vulkan adapter (lavapipe in CI).
#![cfg(feature = "wgpu")]
use ds4_engine::{Backend, Engine, MtpOptions};
use ds4_model::synth::Mix;
use ds4_model::{KvState, Logits};
use ds4_wgpu::{BackendChoice, GpuOptions, WgpuStage};

mod common;
use common::*;

/// Largest |a - b| over the largest |b| (NaN counts as unbounded).
fn rel_err(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len());
    let scale = b.iter().fold(0f64, |m, &x| m.max(x.abs() as f64)).max(1e-30);
    a.iter().zip(b).map(|(&x, &y)| ((x - y) as f64).abs()).fold(0f64, |m, d| if d.is_nan() || m.is_nan() { f64::NAN } else { m.max(d) }) / scale
}

fn argmax(l: &[f32]) -> u32 { ds4_tokenizer::sampling::argmax(l) }

/// Draft logits within this of the CPU's (relative to the largest logit). Measured on lavapipe: up to
/// 3.5e-7 (q2) and 3.3e-7 (q4).
const BOUND: f64 = 2e-6;

/// The same after a run longer than the window, which the device restarts from the last `swa` pairs
/// at position 0 (the CPU keeps the true positions: the same attention up to RoPE rounding).
/// Measured on lavapipe: up to 4.3e-7.
const BOUND_CUT: f64 = 2e-6;

struct Errors {
    pairs: f64,
    recursive: f64,
    after_rollback: f64,
    cut: f64,
}

/// The drafter with steps of `nmax` pairs against the CPU block on the engine's main model.
fn compare(cpu: &mut Engine, nmax: usize) -> Errors {
    let v = cpu.cfg().n_vocab;
    let hd = cpu.cfg().hc_dim();
    let swa = cpu.cfg().swa;
    // Hidden rows of the main model (on the CPU) for a prompt: pair i = (hidden row i, prompt[i + 1]).
    let prompt = tokens(swa + 40, 5, v);
    let n = prompt.len();
    let mut kv = cpu.new_kv();
    cpu.forward(&mut kv, &prompt, None, Logits::None).unwrap();
    let hidden = cpu.stage.hidden(n).to_vec();
    let h = |a: usize, b: usize| &hidden[a * hd..b * hd];
    let t = |a: usize, b: usize| &prompt[a + 1..b + 1];

    let main = WgpuStage::new(&cpu.stage, CTX, 32, cpu.stage.w.range, &GpuOptions { backend: BackendChoice::Vulkan, ..GpuOptions::default() }).unwrap();
    let m = cpu.mtp.as_mut().unwrap();
    let mut dev = main.mtp_drafter(&m.model.stage, nmax, CTX).unwrap();
    let cpu_main = &cpu.stage;
    let w = &cpu_main.w;
    let (mut ckv, mut gkv): (KvState, KvState) = (m.model.new_kv(CTX), m.model.new_kv(CTX));
    let mut e = Errors { pairs: 0.0, recursive: 0.0, after_rollback: 0.0, cut: 0.0 };

    // Ten pairs without logits, then one pair, then four pairs with logits.
    m.model.forward(cpu_main, &mut ckv, h(0, 10), t(0, 10), false).unwrap();
    assert!(dev.forward(w, &mut gkv, h(0, 10), t(0, 10), false).unwrap().is_empty());
    for (a, b) in [(10, 11), (11, 15)] {
        let want = m.model.forward(cpu_main, &mut ckv, h(a, b), t(a, b), true).unwrap().to_vec();
        let got = dev.forward(w, &mut gkv, h(a, b), t(a, b), true).unwrap().to_vec();
        e.pairs = e.pairs.max(rel_err(&got, &want));
        assert_eq!(gkv.pos, ckv.pos);
    }

    // A run longer than the window, then one more pair.
    let (a, b) = (15, 15 + swa + 8);
    let want = m.model.forward(cpu_main, &mut ckv, h(a, b), t(a, b), true).unwrap().to_vec();
    let got = dev.forward(w, &mut gkv, h(a, b), t(a, b), true).unwrap().to_vec();
    assert_eq!(gkv.pos, swa, "the device restarted its cache with the window's pairs");
    e.cut = rel_err(&got, &want);
    let (a, b) = (b, b + 1);
    let want = m.model.forward(cpu_main, &mut ckv, h(a, b), t(a, b), true).unwrap().to_vec();
    let got = dev.forward(w, &mut gkv, h(a, b), t(a, b), true).unwrap().to_vec();
    e.cut = e.cut.max(rel_err(&got, &want));

    // Recursive drafts (the block's own output row and the CPU's top-1), journaled and rolled back.
    // Past the window's length: the drafts overwrite ring rows the next pairs read (half the window:
    // on these random weights a few overwritten rows move the logits by less than the bound).
    let mut d = argmax(&want);
    let (cbase, gbase) = (ckv.pos, gkv.pos);
    ckv.begin_journal();
    dev.begin_journal(&gkv).unwrap();
    let before = dev.ops().gpu().counters();
    for _ in 0..swa / 2 {
        let own = m.model.last_hidden().to_vec();
        let want = m.model.forward(cpu_main, &mut ckv, &own, &[d], true).unwrap().to_vec();
        let got = dev.forward_own(w, &mut gkv, d).unwrap().to_vec();
        e.recursive = e.recursive.max(rel_err(&got, &want));
        d = argmax(&want);
    }
    let after = dev.ops().gpu().counters();
    assert_eq!(
        (after.buffers, after.bind_groups, after.pipelines, after.weight_uploads),
        (before.buffers, before.bind_groups, before.pipelines, before.weight_uploads),
        "a draft step created or uploaded something"
    );
    ckv.rollback(cbase).unwrap();
    ckv.end_journal();
    dev.rollback(&mut gkv).unwrap();
    dev.end_journal();
    assert_eq!(gkv.pos, gbase);

    // After the rollback the cache is the one before the drafts.
    let (a, b) = (b, b + 5);
    let want = m.model.forward(cpu_main, &mut ckv, h(a, b), t(a, b), true).unwrap().to_vec();
    let got = dev.forward(w, &mut gkv, h(a, b), t(a, b), true).unwrap().to_vec();
    e.after_rollback = rel_err(&got, &want);
    e
}

fn drafter_matches_cpu(mix: Mix, tag: &str) {
    if std::env::var_os("XDG_RUNTIME_DIR").is_none() {
        std::env::set_var("XDG_RUNTIME_DIR", std::env::temp_dir());
    }
    let (model, mtp) = files(mix, tag);
    let exact = ds4_model::Options { precision: ds4_quant::Precision::Exact, ..Default::default() };
    let mut cpu = load_with(&model, Some(MtpOptions { path: mtp, draft: 4, margin: 0.0 }), 32, Backend::Cpu, exact);
    for nmax in [32, 4] {
        let e = compare(&mut cpu, nmax);
        eprintln!(
            "{tag} steps of {nmax}: pairs {:.2e}, recursive {:.2e}, after rollback {:.2e}, cut to the window {:.2e} (bounds {BOUND:.0e}, {BOUND_CUT:.0e})",
            e.pairs, e.recursive, e.after_rollback, e.cut
        );
        assert!(e.pairs <= BOUND && e.recursive <= BOUND && e.after_rollback <= BOUND, "{tag} steps of {nmax}: draft logits differ from the CPU block");
        assert!(e.cut <= BOUND_CUT, "{tag} steps of {nmax}: the run cut to the window differs from the CPU block");
    }
}

#[test]
fn wgpu_drafter_matches_cpu_q2() { drafter_matches_cpu(Mix::Q2, "q2-drafter"); }

#[test]
fn wgpu_drafter_matches_cpu_q4() { drafter_matches_cpu(Mix::Q4, "q4-drafter"); }
