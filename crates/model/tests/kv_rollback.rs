//! `KvState::rollback`: after a journaled multi-token forward, rolling back to any position in it gives
//! exactly the state a forward of only those positions leaves (ring rows, compressed and indexer rows,
//! compressor and indexer frontiers), and decoding continues with bit-identical logits. Checked at
//! starts on every side of ratio-4 and ratio-128 window ends.
mod common;
use common::*;
use ds4_model::synth::Mix;
use ds4_model::{Logits, Options};

#[test]
fn rollback_equals_never_having_run() {
    let path = tiny_model(Mix::Q2, "q2");
    let mut st = load(&path, Options::default());
    let v = st.cfg.n_vocab;
    let toks = tokens(140, v, 31);
    for p0 in [1usize, 30, 31, 32, 33, 122, 123, 124, 125, 126, 127, 128] {
        let mut base = st.new_kv(1024);
        st.forward(&mut base, &toks[..p0], None, Logits::None).unwrap();
        for n in 1..=5 {
            let mut kv = base.clone();
            kv.begin_journal();
            st.forward(&mut kv, &toks[p0..p0 + n], None, Logits::All).unwrap();
            for to in (p0..=p0 + n).rev() {
                kv.rollback(to).unwrap();
                let mut want = base.clone();
                if to > p0 {
                    st.forward(&mut want, &toks[p0..to], None, Logits::None).unwrap();
                }
                let mut got = kv.clone();
                got.journal = None;
                assert!(got == want, "p0 {p0} n {n}: state after rollback to {to} differs");
            }
            // Decoding on from the rolled-back state gives the logits of plain decoding.
            kv.end_journal();
            let a = st.forward(&mut kv, &toks[p0..p0 + 1], None, Logits::Last).unwrap().to_vec();
            let mut want = base.clone();
            let b = st.forward(&mut want, &toks[p0..p0 + 1], None, Logits::Last).unwrap().to_vec();
            assert_eq!(a, b);
        }
    }
}

#[test]
fn rollback_outside_the_journal_is_an_error() {
    let path = tiny_model(Mix::Q2, "q2");
    let mut st = load(&path, Options::default());
    let toks = tokens(10, st.cfg.n_vocab, 3);
    let mut kv = st.new_kv(64);
    assert!(kv.rollback(0).is_err(), "no journal");
    st.forward(&mut kv, &toks[..4], None, Logits::None).unwrap();
    kv.begin_journal();
    st.forward(&mut kv, &toks[4..8], None, Logits::None).unwrap();
    assert!(kv.rollback(3).is_err(), "before the journal's start");
    assert!(kv.rollback(9).is_err(), "past the current position");
    assert!(kv.rollback(6).is_ok());
    assert_eq!(kv.pos, 6);
}
