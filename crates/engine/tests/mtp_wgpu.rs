//! MTP speculative decoding on the wgpu backend (`--features wgpu`; lavapipe in CI): the device
//! checkpoints its KV state before each verify step and rolls back past the first rejected draft
//! (`GpuStage::rollback`). Greedy output with MTP is token-for-token the output without it, on the
//! device and against the CPU, with drafts accepted and rejected at every depth, across the ratio-4
//! and ratio-128 compressor boundaries (prompt 100 + 32 crosses 127) and a second turn after a chunked
//! prefill. (Draft lengths 1..4 on the CPU: `tests/mtp.rs`; the device path is the same rollback.)
#![cfg(feature = "wgpu")]
use ds4_engine::{Backend, GenStats, MtpOptions};
use ds4_model::synth::Mix;

mod common;
use common::*;

#[test]
fn vulkan_mtp_greedy_equals_plain_greedy_and_the_cpu() {
    if std::env::var_os("XDG_RUNTIME_DIR").is_none() {
        std::env::set_var("XDG_RUNTIME_DIR", std::env::temp_dir());
    }
    let (model, mtp) = files(Mix::Q2, "q2-wgpu");
    // The CPU with f32 activations, as the GPU computes (its default int8 fast path rounds
    // activations: on this random-weight model that alone changes the first token).
    let exact = ds4_model::Options { precision: ds4_quant::Precision::Exact, ..Default::default() };
    let mut cpu = load_with(&model, None, 32, Backend::Cpu, exact);
    let v = cpu.cfg().n_vocab;
    let (prompt, extra) = (tokens(100, 11, v), tokens(37, 12, v));
    let want = plain_turns(&mut cpu, &prompt, &extra, 32);
    drop(cpu);
    // (Plain greedy on the device equals the CPU: ds4-wgpu tests/stage.rs; here MTP on the device must
    // give the CPU's plain tokens, which it can only do if it also equals the device's plain decode.)
    let flat: Vec<u32> = want.concat();
    {
        let draft = 3;
        let mut eng = load_on(&model, Some(MtpOptions { path: mtp.clone(), draft, margin: 0.0 }), 32, Backend::Vulkan);
        // Drafts right ~70 % of the time: accepted prefixes of every length, rejections at every depth.
        let (mut s, emitted) = right_seven_in_ten(flat.clone(), v, 7 + draft as u64);
        let mut st = GenStats::default();
        let got = spec_turns(&mut eng, &prompt, &extra, 32, &mut s, &emitted, &mut st);
        eprintln!("vulkan draft {draft}: drafted {} accepted {} ({:.2})", st.drafted, st.accepted, st.acceptance());
        assert_eq!(got, want, "vulkan draft {draft}: MTP greedy differs from plain greedy on the CPU");
        assert!(st.accepted > 0 && st.accepted < st.drafted, "vulkan draft {draft}: {st:?}");
    }
}

/// A verify step holds the token and its drafts even when `--prefill-chunk` is smaller: the device's
/// activation rows are sized for both (prefill chunk 2, draft 4: verify steps of 5 tokens).
#[test]
fn vulkan_mtp_with_a_prefill_chunk_below_the_verify_rows() {
    if std::env::var_os("XDG_RUNTIME_DIR").is_none() {
        std::env::set_var("XDG_RUNTIME_DIR", std::env::temp_dir());
    }
    let (model, mtp) = files(Mix::Q4, "q4-wgpu-chunk");
    let mut plain = load_on(&model, None, 2, Backend::Vulkan);
    let v = plain.cfg().n_vocab;
    let (prompt, extra) = (tokens(9, 21, v), tokens(3, 22, v));
    let want = plain_turns(&mut plain, &prompt, &extra, 12);
    drop(plain);
    let mut eng = load_on(&model, Some(MtpOptions { path: mtp, draft: 4, margin: 0.0 }), 2, Backend::Vulkan);
    let (mut s, emitted) = right_seven_in_ten(want.concat(), v, 5);
    let mut st = GenStats::default();
    let got = spec_turns(&mut eng, &prompt, &extra, 12, &mut s, &emitted, &mut st);
    assert_eq!(got, want, "MTP greedy with --prefill-chunk 2, draft 4 differs from plain greedy");
    assert!(st.drafted >= 4 && st.accepted > 0, "{st:?}");
}
