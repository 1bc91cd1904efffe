//! The MTP drafter on the wgpu device (`WgpuStage::mtp_drafter`, `ds4_gpu::GpuMtp`) against the CPU
//! block (`Mtp::forward`, `Precision::Exact`) on tiny q2 and q4 models with a synthetic MTP file: the
//! draft logits of runs of pairs (in one step and in steps of 4), of recursive drafts from the block's
//! own output row, after a rollback of those drafts, and of a run longer than the window (which the
//! device cuts to the window); nothing is allocated, bound or uploaded per draft step. Needs
//! `--features wgpu` and a Vulkan adapter (lavapipe in CI).
#![cfg(feature = "wgpu")]
use ds4_engine::{Backend, MtpOptions};
use ds4_model::synth::Mix;
use ds4_wgpu::{BackendChoice, GpuOptions, WgpuStage};

mod common;
use common::drafter::compare;
use common::*;

/// Draft logits within this of the CPU's (relative to the largest logit). Measured on lavapipe: up to
/// 3.5e-7 (q2) and 3.3e-7 (q4).
const BOUND: f64 = 2e-6;

/// The same after a run longer than the window, which the device restarts from the last `swa` pairs
/// at position 0 (the CPU keeps the true positions: the same attention up to RoPE rounding).
/// Measured on lavapipe: up to 4.3e-7.
const BOUND_CUT: f64 = 2e-6;

fn drafter_matches_cpu(mix: Mix, tag: &str) {
    if std::env::var_os("XDG_RUNTIME_DIR").is_none() {
        std::env::set_var("XDG_RUNTIME_DIR", std::env::temp_dir());
    }
    let (model, mtp) = files(mix, tag);
    let exact = ds4_model::Options { precision: ds4_quant::Precision::Exact, ..Default::default() };
    let mut cpu = load_with(&model, Some(MtpOptions { path: mtp, draft: 4, margin: 0.0 }), 32, Backend::Cpu, exact);
    for nmax in [32, 4] {
        let build = |cpu: &ds4_engine::Engine| {
            let main = WgpuStage::new(&cpu.stage, CTX, 32, cpu.stage.w.range, &GpuOptions { backend: BackendChoice::Vulkan, ..GpuOptions::default() }).unwrap();
            main.mtp_drafter(&cpu.mtp.as_ref().unwrap().model.stage, nmax, CTX).unwrap()
        };
        let counters = |d: &ds4_wgpu::WgpuMtp| {
            let c = d.ops().gpu().counters();
            vec![c.buffers, c.bind_groups, c.pipelines, c.weight_uploads]
        };
        let e = compare(&mut cpu, build, counters);
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
