//! The MTP drafter on CUDA (`CudaStage::mtp_drafter`, `ds4_gpu::GpuMtp`) against the CPU block
//! (`Mtp::forward`, `Precision::Exact`) on tiny q2 and q4 models with a synthetic MTP file: the same
//! sequence as `mtp_drafter_wgpu.rs` (pair runs, recursive drafts from the block's own output row, a
//! rollback of them, a run longer than the window), and no device allocation or weight upload per
//! draft step. Needs `--features cuda` and a GPU; skips without one (as `cuda_pipeline.rs`).
//!
//! cargo test --release -p ds4-engine --features cuda --test mtp_drafter_cuda -- --nocapture
#![cfg(feature = "cuda")]
use ds4_cuda::CudaStage;
use ds4_engine::{Backend, MtpOptions};
use ds4_model::synth::Mix;

mod common;
use common::drafter::compare;
use common::*;

/// Draft logits within this of the CPU's (relative to the largest logit): measured on an H100 at
/// 1.8e-7..4.5e-7 over pairs, recursive drafts, rollbacks and runs cut to the window
/// (bench/results/cuda/session_mtp/mtp_tests.log); the wgpu drafter's bound.
const BOUND: f64 = 2e-6;

fn drafter_matches_cpu(mix: Mix, tag: &str) {
    let (model, mtp) = files(mix, tag);
    let exact = ds4_model::Options { precision: ds4_quant::Precision::Exact, ..Default::default() };
    let mut cpu = load_with(&model, Some(MtpOptions { path: mtp, draft: 4, margin: 0.0 }), 32, Backend::Cpu, exact);
    let main = match CudaStage::new(&cpu.stage, CTX, 32) {
        Ok(s) => s,
        Err(e) if e.to_string().contains("CUDA driver") || e.to_string().contains("usable CUDA device") => {
            eprintln!("SKIPPED: {e}");
            return;
        }
        Err(e) => panic!("{e}"),
    };
    let build = |cpu: &ds4_engine::Engine| main.mtp_drafter(&cpu.mtp.as_ref().unwrap().model.stage, CTX).unwrap();
    let counters = |_: &ds4_cuda::CudaMtp| {
        let s = CudaStage::stats();
        vec![s.device_allocs, s.weight_uploads]
    };
    let e = compare(&mut cpu, build, counters);
    eprintln!(
        "{tag} cuda drafter: pairs {:.2e}, recursive {:.2e}, after rollback {:.2e}, cut to the window {:.2e} (bound {BOUND:.0e})",
        e.pairs, e.recursive, e.after_rollback, e.cut
    );
    assert!(e.max() <= BOUND, "{tag}: draft logits differ from the CPU block");
    assert!(e.cut <= BOUND, "{tag}: the run cut to the window differs from the CPU block");
}

#[test]
fn cuda_drafter_matches_cpu_q2() { drafter_matches_cpu(Mix::Q2, "q2-cuda-drafter"); }

#[test]
fn cuda_drafter_matches_cpu_q4() { drafter_matches_cpu(Mix::Q4, "q4-cuda-drafter"); }
