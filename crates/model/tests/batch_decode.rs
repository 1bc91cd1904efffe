//! A batched decode step over several sequences gives every sequence bit-identical logits to a decode
//! step run for that sequence alone (the row products are row-independent; attention runs per sequence).
mod common;
use common::*;
use ds4_model::synth::Mix;
use ds4_model::{KvState, Logits, Options, Stage};
use ds4_quant::Precision;

const CTX: usize = 1024;

/// Prefills `prompt` alone, then decodes `steps` alone: the logit row after each step.
fn alone(st: &mut Stage, prompt: &[u32], steps: &[u32]) -> Vec<Vec<f32>> {
    let mut kv = st.new_kv(CTX);
    st.forward(&mut kv, prompt, None, Logits::None).unwrap();
    steps.iter().map(|t| st.forward(&mut kv, std::slice::from_ref(t), None, Logits::Last).unwrap().to_vec()).collect()
}

struct Seq {
    kv: KvState,
    steps: Vec<u32>,
    done: usize,
    got: Vec<Vec<f32>>,
}

fn check(mix: Mix, tag: &str, precision: Precision) {
    let path = tiny_model(mix, tag);
    let mut st = load(&path, Options { precision, ..Options::default() });
    let v = st.cfg.n_vocab;
    // Prompt lengths on both sides of the window (128) and of compressor/indexer boundaries.
    let lens = [1usize, 37, 130, 300];
    let steps = 24;
    let prompts: Vec<Vec<u32>> = lens.iter().enumerate().map(|(i, &n)| tokens(n, v, 10 + i as u64)).collect();
    let conts: Vec<Vec<u32>> = (0..lens.len()).map(|i| tokens(steps, v, 50 + i as u64)).collect();
    let want: Vec<Vec<Vec<f32>>> = prompts.iter().zip(&conts).map(|(p, c)| alone(&mut st, p, c)).collect();

    let mut seqs: Vec<Seq> = prompts
        .iter()
        .zip(&conts)
        .map(|(p, c)| {
            let mut kv = st.new_kv(CTX);
            st.forward(&mut kv, p, None, Logits::None).unwrap();
            Seq { kv, steps: c.clone(), done: 0, got: Vec::new() }
        })
        .collect();
    // Sequence 3 joins after 5 steps; sequence 1 is dropped (cancelled) after 9 steps.
    for step in 0..steps + 5 {
        let active: Vec<usize> = (0..seqs.len())
            .filter(|&i| !(i == 3 && step < 5) && !(i == 1 && step >= 9) && seqs[i].done < steps)
            .collect();
        if active.is_empty() {
            break;
        }
        let toks: Vec<u32> = active.iter().map(|&i| seqs[i].steps[seqs[i].done]).collect();
        let mut refs: Vec<&mut KvState> = Vec::new();
        for (i, s) in seqs.iter_mut().enumerate() {
            if active.contains(&i) {
                refs.push(&mut s.kv);
            }
        }
        let rows = st.forward_batch(&mut refs, &toks, None).unwrap().to_vec();
        assert_eq!(rows.len(), active.len() * v);
        for (j, &i) in active.iter().enumerate() {
            seqs[i].got.push(rows[j * v..(j + 1) * v].to_vec());
            seqs[i].done += 1;
        }
    }
    for (i, s) in seqs.iter().enumerate() {
        let n = if i == 1 { 9 } else { steps };
        assert_eq!(s.got.len(), n, "seq {i}");
        for (k, (g, w)) in s.got.iter().zip(&want[i]).enumerate() {
            assert!(g == w, "{tag} {precision:?}: seq {i} step {k}: batched logits differ from alone (rel {})", rel_err(g, w));
        }
        assert_eq!(s.kv.pos, lens[i] + n);
    }
}

#[test]
fn batched_decode_equals_alone_f16_fast() {
    check(Mix::F16, "f16", Precision::Fast);
}

#[test]
fn batched_decode_equals_alone_q2_fast() {
    check(Mix::Q2, "q2", Precision::Fast);
}

#[test]
fn batched_decode_equals_alone_q4_exact() {
    check(Mix::Q4, "q4", Precision::Exact);
}

/// A prefill slice of one sequence and decode rows of others in one pass: each as if alone.
#[test]
fn mixed_prefill_and_decode_in_one_pass() {
    let path = tiny_model(Mix::Q4, "q4");
    let mut st = load(&path, Options::default());
    let v = st.cfg.n_vocab;
    let (pa, pb) = (tokens(140, v, 1), tokens(60, v, 2));
    let chunk = tokens(20, v, 3);
    let next = tokens(1, v, 4);
    // Alone.
    let mut ka = st.new_kv(CTX);
    st.forward(&mut ka, &pa, None, Logits::None).unwrap();
    let wa = st.forward(&mut ka, &chunk, None, Logits::Last).unwrap().to_vec();
    let mut kb = st.new_kv(CTX);
    st.forward(&mut kb, &pb, None, Logits::None).unwrap();
    let wb = st.forward(&mut kb, &next, None, Logits::Last).unwrap().to_vec();
    // Together.
    let mut ka2 = st.new_kv(CTX);
    st.forward(&mut ka2, &pa, None, Logits::None).unwrap();
    let mut kb2 = st.new_kv(CTX);
    st.forward(&mut kb2, &pb, None, Logits::None).unwrap();
    let toks: Vec<u32> = chunk.iter().chain(&next).copied().collect();
    let got = st.forward_many(&mut [&mut ka2, &mut kb2], &[20, 1], &toks, None, Logits::Last).unwrap().to_vec();
    assert!(got[..v] == wa[..] && got[v..] == wb[..]);
    assert_eq!(ka2, ka);
    assert_eq!(kb2, kb);
}

#[test]
fn bad_batches_are_errors() {
    let path = tiny_model(Mix::F16, "f16");
    let mut st = load(&path, Options::default());
    let mut a = st.new_kv(4);
    let mut b = st.new_kv(4);
    assert!(st.forward_batch(&mut [&mut a, &mut b], &[1], None).is_err());
    assert!(st.forward_many(&mut [&mut a, &mut b], &[2, 0], &[1, 2], None, Logits::Last).is_err());
    st.forward(&mut a, &[1, 2, 3, 4], None, Logits::None).unwrap();
    // a is full: the whole batch is refused and b is untouched.
    assert!(st.forward_batch(&mut [&mut a, &mut b], &[1, 2], None).is_err());
    assert_eq!(b.pos, 0);
}
