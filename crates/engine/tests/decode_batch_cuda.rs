//! `Engine::decode_batch` on CUDA (`--features cuda`; skips without a usable GPU): sessions each in their
//! own device KV slot (`KvState::slot`), prefilled one by one through `Session::sync`, then stepped
//! together (one joining mid-stream, one leaving). With `LoadOptions::deterministic` every row's
//! logits are bit-identical to the session decoded alone, and so without it in batches of up to 8
//! sessions (exact rows by default there). A pipeline over several parts refuses batches.
#![cfg(feature = "cuda")]
use ds4_engine::{resolve_model, Backend, Engine, LoadOptions, Session};
use ds4_quant::Precision;
use std::sync::atomic::AtomicBool;

fn argmax(l: &[f32]) -> u32 {
    l.iter().enumerate().fold((0usize, f32::NEG_INFINITY), |b, (i, &v)| if v > b.1 { (i, v) } else { b }).0 as u32
}

mod common;
use common::tokens as prompt;

fn engine(slots: usize, deterministic: bool, devices: Vec<usize>) -> Option<Result<Engine, String>> { engine_p(slots, deterministic, devices, LoadOptions::default().options.precision) }

fn engine_p(slots: usize, deterministic: bool, devices: Vec<usize>, precision: Precision) -> Option<Result<Engine, String>> {
    let path = resolve_model(None).unwrap().path().to_path_buf();
    let mut opts = LoadOptions { ctx: 160, prefill_chunk: 32, backend: Backend::Cuda, cuda_devices: devices, batch_slots: slots, deterministic, quiet: true, ..LoadOptions::default() };
    opts.options.precision = precision;
    match Engine::load(&path, &opts) {
        Ok(e) => Some(Ok(e)),
        Err(e) if e.to_string().contains("CUDA driver") || e.to_string().contains("usable CUDA device") => {
            eprintln!("SKIPPED: {e}");
            None
        }
        Err(e) => Some(Err(e.to_string())),
    }
}

/// Logits after the prompt and after each greedy step of `p`, decoded alone (slot 0).
fn alone(eng: &mut Engine, p: &[u32], steps: usize) -> Vec<Vec<f32>> {
    let mut s = Session::new(eng);
    s.sync(eng, p, &mut |_, _| {}, &AtomicBool::new(false)).unwrap();
    let mut out = vec![s.logits.clone()];
    for _ in 0..steps {
        let t = argmax(&s.logits);
        s.step(eng, t).unwrap();
        out.push(s.logits.clone());
    }
    out
}

/// Runs the schedule; returns (alone rows, batched rows) per session. Batched sessions are fed the
/// alone run's greedy tokens, so rows stay comparable after a disagreement.
fn schedule(eng: &mut Engine) -> (Vec<Vec<Vec<f32>>>, Vec<Vec<Vec<f32>>>) {
    assert_eq!(eng.kv_slots(), 4);
    assert!(eng.batched_decode());
    let v = eng.cfg().n_vocab;
    let lens = [3usize, 37, 70, 21];
    let steps = 8;
    // Session 3 joins before step 2; session 0 leaves after step 5.
    let takes = |i: usize, step: usize| (i != 3 || step >= 2) && (i != 0 || step <= 5);
    let prompts: Vec<Vec<u32>> = lens.iter().enumerate().map(|(i, &n)| prompt(n, 7 + i as u64, v)).collect();
    let counts: Vec<usize> = (0..4).map(|i| (0..steps).filter(|&s| takes(i, s)).count()).collect();
    let want: Vec<Vec<Vec<f32>>> = prompts.iter().zip(&counts).map(|(p, &n)| alone(eng, p, n)).collect();
    let never = AtomicBool::new(false);
    let mut sess: Vec<Session> = (0..4)
        .map(|i| {
            let mut s = Session::new(eng);
            s.kv.slot = i;
            s
        })
        .collect();
    let mut got: Vec<Vec<Vec<f32>>> = vec![Vec::new(); 4];
    for i in 0..3 {
        sess[i].sync(eng, &prompts[i], &mut |_, _| {}, &never).unwrap();
        got[i].push(sess[i].logits.clone());
    }
    for step in 0..steps {
        if step == 2 {
            sess[3].sync(eng, &prompts[3], &mut |_, _| {}, &never).unwrap();
            got[3].push(sess[3].logits.clone());
        }
        let active: Vec<usize> = (0..4).filter(|&i| takes(i, step)).collect();
        let toks: Vec<u32> = active.iter().map(|&i| argmax(&want[i][got[i].len() - 1])).collect();
        let mut kvs: Vec<&mut ds4_model::KvState> = sess.iter_mut().enumerate().filter(|(i, _)| active.contains(i)).map(|(_, s)| &mut s.kv).collect();
        let rows = eng.decode_batch(&mut kvs, &toks).unwrap().to_vec();
        for (j, &i) in active.iter().enumerate() {
            sess[i].tokens.push(toks[j]);
            sess[i].logits = rows[j * v..(j + 1) * v].to_vec();
            got[i].push(sess[i].logits.clone());
        }
    }
    for i in 0..4 {
        assert_eq!(got[i].len(), want[i].len(), "session {i}: rows");
    }
    (want, got)
}

#[test]
fn sessions_batched_on_cuda_deterministic_equal_alone_bitwise() {
    let Some(eng) = engine(4, true, vec![0]) else { return };
    let mut eng = eng.unwrap();
    let (want, got) = schedule(&mut eng);
    for i in 0..4 {
        for (k, (g, w)) in got[i].iter().zip(&want[i]).enumerate() {
            assert!(g.iter().zip(w).all(|(a, b)| a.to_bits() == b.to_bits()), "session {i} row {k}: batched logits differ from alone");
        }
    }
    let firsts: std::collections::HashSet<u32> = want.iter().map(|w| argmax(&w[1])).collect();
    assert!(firsts.len() > 1, "degenerate model: every session picks the same token");
}

/// Agreement of the default batch with decoding alone: (rows picking the same token, rows, worst
/// logits relative error); the prefill rows (same kernels in another slot) must be bit-identical.
fn default_agreement(precision: Precision) -> Option<(usize, usize, f64)> {
    let mut eng = engine_p(4, false, vec![0], precision)?.unwrap();
    let (want, got) = schedule(&mut eng);
    let rel = |a: &[f32], b: &[f32]| {
        let num: f64 = a.iter().zip(b).map(|(x, y)| ((x - y) as f64).powi(2)).sum();
        let den: f64 = b.iter().map(|y| (*y as f64).powi(2)).sum();
        (num / den.max(1e-30)).sqrt()
    };
    let (mut same, mut total, mut worst) = (0, 0, 0f64);
    for i in 0..4 {
        assert!(got[i][0].iter().zip(&want[i][0]).all(|(a, b)| a.to_bits() == b.to_bits()), "session {i}: prefill row differs");
        for (g, w) in got[i].iter().zip(&want[i]).skip(1) {
            assert!(g.iter().all(|x| x.is_finite()), "session {i}: non-finite batched logits");
            worst = worst.max(rel(g, w));
            same += (argmax(g) == argmax(w)) as usize;
            total += 1;
        }
    }
    println!("engine default CUDA batch, {precision:?}: {same}/{total} rows pick the token of decoding alone; worst logits rel err {worst:.2e}");
    Some((same, total, worst))
}

/// The default batch of up to 8 sessions takes exact rows (`ds4_cuda::EXACT_BATCH_ROWS`: faster there
/// than the multi-token kernels), so without `--deterministic` too every row is bit-identical to the
/// session decoded alone, under both precisions. (The multi-token kernels of larger batches are
/// tested against decoding alone in the ds4-cuda device tests.)
#[test]
fn sessions_batched_on_cuda_default_equal_alone_bitwise() {
    for p in [Precision::Exact, Precision::Fast] {
        let Some((same, total, worst)) = default_agreement(p) else { return };
        assert!(total == 28 && same == total && worst == 0.0, "{p:?}: {same}/{total}, worst {worst:.2e}");
    }
}

#[test]
fn several_cuda_parts_refuse_batches_at_load() {
    let Some(r) = engine(2, false, vec![0, 0]) else { return };
    let e = r.err().expect("two parts with two sessions must be refused");
    assert!(e.contains("one GPU") && e.contains("--cuda-devices"), "{e}");
    // One session over two parts still loads, and does not batch.
    let Some(r) = engine(1, false, vec![0, 0]) else { return };
    let mut eng = r.unwrap();
    assert!(!eng.batched_decode());
    let (mut a, mut b) = (eng.new_kv(), eng.new_kv());
    let e = eng.decode_batch(&mut [&mut a, &mut b], &[1, 2]).err().map(|e| e.to_string()).unwrap_or_default();
    assert!(e.contains("needs a KV slot per session"), "{e}");
}
