//! MTP speculative decoding on CUDA: a verify step runs as exact rows (each row computed as its
//! decode step computes it, bit for bit: ds4-cuda tests/device.rs `verify_rows_*`), and a rollback
//! restores the device checkpoint and re-runs the kept tokens the same way. So greedy output with MTP
//! is token-for-token the output without it: draft 1..4, drafts accepted and rejected at every depth
//! (an oracle drafter right ~70 % of the time), across the ratio-4 and ratio-128 compressor
//! boundaries (prompt 100 + 32 crosses 127) and a second turn after a chunked prefill; and with the
//! block's own drafts made on the GPU. Skips without a usable GPU.
#![cfg(feature = "cuda")]
use ds4_engine::{Backend, Engine, GenStats, LoadOptions, MtpOptions};
use ds4_model::synth::Mix;
use std::cell::Cell;
use std::path::PathBuf;
use std::rc::Rc;

mod common;
use common::*;

fn cuda(model: &PathBuf, mtp: Option<MtpOptions>) -> Option<Engine> {
    let opts = LoadOptions { ctx: CTX, prefill_chunk: 32, quiet: true, mtp, backend: Backend::Cuda, ..LoadOptions::default() };
    match Engine::load(model, &opts) {
        Ok(e) => Some(e),
        Err(e) if e.to_string().contains("CUDA driver") || e.to_string().contains("usable CUDA device") => {
            eprintln!("SKIPPED: {e}");
            None
        }
        Err(e) => panic!("{e}"),
    }
}

fn mix_case(mix: Mix, tag: &str) {
    let (model, mtp) = files(mix, tag);
    let Some(mut plain) = cuda(&model, None) else { return };
    let v = plain.cfg().n_vocab;
    let (prompt, extra) = (tokens(100, 11, v), tokens(37, 12, v));
    let want = plain_turns(&mut plain, &prompt, &extra, 32);
    drop(plain);
    let flat: Vec<u32> = want.concat();
    for draft in 1..=4 {
        let mut eng = cuda(&model, Some(MtpOptions { path: mtp.clone(), draft, margin: 0.0 })).expect("the GPU was there a moment ago");
        let (mut s, emitted) = right_seven_in_ten(flat.clone(), v, 7 + draft as u64);
        let mut st = GenStats::default();
        let got = spec_turns(&mut eng, &prompt, &extra, 32, &mut s, &emitted, &mut st);
        println!("cuda {mix:?} draft {draft}: drafted {} accepted {} ({:.2})", st.drafted, st.accepted, st.acceptance());
        assert_eq!(got, want, "cuda {mix:?} draft {draft}: MTP greedy differs from plain greedy");
        assert!(st.accepted > 0 && st.accepted < st.drafted, "cuda {mix:?} draft {draft}: {st:?}");
    }
    // The block's own drafts, made on the GPU (random weights: mostly rejected).
    let mut eng = cuda(&model, Some(MtpOptions { path: mtp.clone(), draft: 2, margin: 0.0 })).expect("GPU");
    let emitted = Rc::new(Cell::new(0));
    let mut st = GenStats::default();
    let got = spec_turns(&mut eng, &prompt, &extra, 32, &mut Greedy, &emitted, &mut st);
    println!("cuda {mix:?} block drafts: drafted {} accepted {}", st.drafted, st.accepted);
    assert_eq!(got, want, "cuda {mix:?}: MTP greedy with the block's drafts differs from plain greedy");
    assert!(st.drafted > 0);
}

#[test]
fn cuda_mtp_greedy_equals_plain_greedy_q2() { mix_case(Mix::Q2, "q2-cuda"); }

#[test]
fn cuda_mtp_greedy_equals_plain_greedy_q4() { mix_case(Mix::Q4, "q4-cuda"); }
