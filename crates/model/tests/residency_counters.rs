//! After load, prefill and decode perform no weight map/bind/upload (own process: counters are global).
mod common;
use common::*;
use ds4_model::residency::{self, Op, Phase};
use ds4_model::synth::Mix;
use ds4_model::{Logits, Options};

#[test]
fn decode_performs_no_residency_operations() {
    let path = tiny_model(Mix::Q4, "q4");
    residency::set_phase(Phase::Load);
    let mut st = load(&path, Options::default());
    let after_load = residency::snapshot();
    assert!(after_load.get(Phase::Load, Op::Map) >= 1 && after_load.get(Phase::Load, Op::Bind) > 0);
    let toks = tokens(64, st.cfg.n_vocab, 5);
    let mut kv = st.new_kv(512);
    residency::set_phase(Phase::Prefill);
    st.forward(&mut kv, &toks[..32], None, Logits::Last).unwrap();
    residency::set_phase(Phase::Decode);
    for t in 0..64 {
        st.forward(&mut kv, &toks[t % 32..t % 32 + 1], None, Logits::Last).unwrap();
        let c = residency::snapshot();
        assert_eq!(c.total(Phase::Decode), 0, "token {t}");
    }
    assert_eq!(residency::snapshot().total(Phase::Prefill), 0);
}
