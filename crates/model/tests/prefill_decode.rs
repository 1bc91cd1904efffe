//! Prefill in chunks, token-by-token decode and decode-after-prefill must give the same logits.
mod common;
use common::*;
use ds4_model::synth::Mix;
use ds4_model::{Logits, Options};

const N: usize = 300;

fn run_chunks(stage: &mut ds4_model::Stage, toks: &[u32], chunk: usize) -> Vec<f32> {
    let mut kv = stage.new_kv(1024);
    let mut all = Vec::new();
    for c in toks.chunks(chunk) {
        all.extend_from_slice(stage.forward(&mut kv, c, None, Logits::All).unwrap());
    }
    all
}

#[test]
fn chunked_prefill_equals_token_by_token() {
    let path = tiny_model(Mix::F16, "f16");
    for opts in [Options::default(), Options { qat: false, ..Options::default() }] {
        let mut st = load(&path, opts);
        let toks = tokens(N, st.cfg.n_vocab, 1);
        let one = run_chunks(&mut st, &toks, 1);
        assert!(one.iter().all(|v| v.is_finite()));
        for chunk in [7, 64, N] {
            let got = run_chunks(&mut st, &toks, chunk);
            let e = rel_err(&got, &one);
            eprintln!("qat={} chunk={chunk}: max rel err {e:.3e}", opts.qat);
            assert!(e <= 1e-4, "chunk {chunk}: rel err {e}");
        }
    }
}

#[test]
fn decode_after_prefill_and_snapshot_restore() {
    let path = tiny_model(Mix::F16, "f16");
    let mut st = load(&path, Options::default());
    let v = st.cfg.n_vocab;
    let toks = tokens(N, v, 2);
    let reference = run_chunks(&mut st, &toks, 1);
    let mut kv = st.new_kv(1024);
    st.forward(&mut kv, &toks[..200], None, Logits::None).unwrap();
    let snap = kv.clone();
    let mut got = Vec::new();
    for t in &toks[200..] {
        got.extend_from_slice(st.forward(&mut kv, std::slice::from_ref(t), None, Logits::Last).unwrap());
    }
    assert!(rel_err(&got, &reference[200 * v..]) <= 1e-4);
    // Restore the snapshot and decode again: identical results.
    let mut kv2 = snap;
    let mut again = Vec::new();
    for t in &toks[200..] {
        again.extend_from_slice(st.forward(&mut kv2, std::slice::from_ref(t), None, Logits::Last).unwrap());
    }
    assert_eq!(got, again);
}

#[test]
fn context_overflow_is_an_error() {
    let path = tiny_model(Mix::F16, "f16");
    let mut st = load(&path, Options::default());
    let mut kv = st.new_kv(16);
    let toks = tokens(17, st.cfg.n_vocab, 3);
    assert!(st.forward(&mut kv, &toks, None, Logits::Last).is_err());
}

#[test]
fn logits_are_informative() {
    let path = tiny_model(Mix::F16, "f16");
    let mut st = load(&path, Options::default());
    let v = st.cfg.n_vocab;
    let toks = tokens(40, v, 4);
    let all = run_chunks(&mut st, &toks, 40);
    let row = |i: usize| &all[i * v..(i + 1) * v];
    let std = |r: &[f32]| {
        let m = r.iter().sum::<f32>() / r.len() as f32;
        (r.iter().map(|x| (x - m) * (x - m)).sum::<f32>() / r.len() as f32).sqrt()
    };
    eprintln!("logit std at 0: {} at 39: {}; first {:?}", std(row(0)), std(row(39)), &row(39)[..4]);
    assert!(std(row(0)) > 0.1 && std(row(39)) > 0.1);
    assert!(rel_err(row(38), row(39)) > 1e-2, "positions must differ");
}
