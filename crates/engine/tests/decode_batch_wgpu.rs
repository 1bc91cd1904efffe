//! `Engine::decode_batch` on the wgpu backend (`--features wgpu`; lavapipe in CI): sessions each in
//! their own device KV slot (`KvState::slot`), prefilled one by one through `Session::sync`, then
//! stepped together (one joining mid-stream, one leaving): every row's logits are bit-identical to the
//! session decoded alone, and its greedy tokens equal. Bad batches are errors, not panics.
#![cfg(feature = "wgpu")]
use ds4_engine::{resolve_model, Backend, Engine, LoadOptions, Session};
use std::sync::atomic::AtomicBool;

fn argmax(l: &[f32]) -> u32 {
    l.iter().enumerate().fold((0usize, f32::NEG_INFINITY), |b, (i, &v)| if v > b.1 { (i, v) } else { b }).0 as u32
}

mod common;
use common::tokens as prompt;

fn engine(slots: usize) -> Engine {
    if std::env::var_os("XDG_RUNTIME_DIR").is_none() {
        std::env::set_var("XDG_RUNTIME_DIR", std::env::temp_dir());
    }
    let path = resolve_model(None).unwrap().path().to_path_buf();
    let opts = LoadOptions { ctx: 160, prefill_chunk: 32, backend: Backend::Vulkan, batch_slots: slots, quiet: true, ..LoadOptions::default() };
    Engine::load(&path, &opts).unwrap()
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

#[test]
fn sessions_batched_on_vulkan_equal_alone_bitwise() {
    let mut eng = engine(4);
    assert_eq!(eng.kv_slots(), 4);
    assert!(eng.batched_decode());
    let v = eng.cfg().n_vocab;
    let lens = [3usize, 37, 70, 21];
    let steps = 6;
    // Session 3 joins before step 2; session 0 leaves after step 3.
    let takes = |i: usize, step: usize| (i != 3 || step >= 2) && (i != 0 || step <= 3);
    let prompts: Vec<Vec<u32>> = lens.iter().enumerate().map(|(i, &n)| prompt(n, 7 + i as u64, v)).collect();
    let counts: Vec<usize> = (0..4).map(|i| (0..steps).filter(|&s| takes(i, s)).count()).collect();
    let want: Vec<Vec<Vec<f32>>> = prompts.iter().zip(&counts).map(|(p, &n)| alone(&mut eng, p, n)).collect();

    let never = AtomicBool::new(false);
    let mut sess: Vec<Session> = (0..4)
        .map(|i| {
            let mut s = Session::new(&eng);
            s.kv.slot = i;
            s
        })
        .collect();
    let mut got: Vec<Vec<Vec<f32>>> = vec![Vec::new(); 4];
    for i in 0..3 {
        sess[i].sync(&mut eng, &prompts[i], &mut |_, _| {}, &never).unwrap();
        got[i].push(sess[i].logits.clone());
    }
    for step in 0..steps {
        if step == 2 {
            sess[3].sync(&mut eng, &prompts[3], &mut |_, _| {}, &never).unwrap();
            got[3].push(sess[3].logits.clone());
        }
        let active: Vec<usize> = (0..4).filter(|&i| takes(i, step)).collect();
        let toks: Vec<u32> = active.iter().map(|&i| argmax(&sess[i].logits)).collect();
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
        for (k, (g, w)) in got[i].iter().zip(&want[i]).enumerate() {
            assert!(g.iter().zip(w).all(|(a, b)| a.to_bits() == b.to_bits()), "session {i} row {k}: batched logits differ from alone");
        }
    }
    // Not vacuous: the sessions' greedy streams differ from each other.
    let firsts: std::collections::HashSet<u32> = want.iter().map(|w| argmax(&w[1])).collect();
    assert!(firsts.len() > 1, "degenerate model: every session picks the same token");

    // Bad batches: more sessions than slots, a slot out of range, the same slot twice.
    let mut extra = Session::new(&eng);
    extra.kv.slot = 0;
    let mut five: Vec<&mut ds4_model::KvState> = sess.iter_mut().map(|s| &mut s.kv).chain(std::iter::once(&mut extra.kv)).collect();
    let e = eng.decode_batch(&mut five, &[1; 5]).err().map(|e| e.to_string()).unwrap_or_default();
    assert!(e.contains("exceeds the 4 KV slots"), "{e}");
    drop(five);
    sess[1].kv.slot = 9;
    let mut two: Vec<&mut ds4_model::KvState> = sess.iter_mut().skip(1).take(2).map(|s| &mut s.kv).collect();
    let e = eng.decode_batch(&mut two, &[1, 2]).err().map(|e| e.to_string()).unwrap_or_default();
    assert!(e.contains("KV slot 9 does not exist"), "{e}");
    drop(two);
    sess[1].kv.slot = 2;
    let mut two: Vec<&mut ds4_model::KvState> = sess.iter_mut().skip(1).take(2).map(|s| &mut s.kv).collect();
    let e = eng.decode_batch(&mut two, &[1, 2]).err().map(|e| e.to_string()).unwrap_or_default();
    assert!(e.contains("appears twice"), "{e}");
}

#[test]
fn one_slot_engine_does_not_batch() {
    let mut eng = engine(1);
    assert!(!eng.batched_decode());
    let mut a = eng.new_kv();
    let mut b = eng.new_kv();
    let e = eng.decode_batch(&mut [&mut a, &mut b], &[1, 2]).err().map(|e| e.to_string()).unwrap_or_default();
    assert!(e.contains("needs a KV slot per session"), "{e}");
}
