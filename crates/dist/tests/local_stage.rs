//! A stage's executor on batches larger than its engine takes at once (a GPU's buffers are sized for
//! its prefill chunk): the request runs in pieces and answers exactly what the pieces fed one by one
//! to the stage give.
mod common;
use common::*;
use ds4_dist::exec::{Activations, StageRequest};
use ds4_dist::protocol::{fnv1a_tokens, Payload, Want, FNV_OFFSET};
use ds4_model::Logits;

fn req<'a>(tokens: &'a [u32], input: Option<&'a Activations>, want: Want) -> StageRequest<'a> {
    StageRequest { session: 1, pos: 0, prefix_hash: FNV_OFFSET, tokens, input: input.map(Activations::as_ref), want, bits: 32 }
}

#[test]
fn a_batch_larger_than_the_engine_takes_runs_in_pieces() {
    let prompt: Vec<u32> = (0..10).map(|i| (i * 37 + 5) % 500).collect();
    let piece = 3;
    // What the pieces give, fed one by one straight to the stages.
    let (mut a, cfg, _) = load(model(), "0:2");
    let (mut b, _, _) = load(model(), "3:output");
    let hd = cfg.hc_dim();
    let (mut ka, mut kb) = (a.stage().new_kv(CTX), b.stage().new_kv(CTX));
    let (mut hidden, mut logits) = (Vec::new(), Vec::new());
    for c in prompt.chunks(piece) {
        a.engine.stage.forward(&mut ka, c, None, Logits::None).unwrap();
        let h = a.engine.stage.hidden(c.len()).to_vec();
        logits.extend_from_slice(b.engine.stage.forward(&mut kb, c, Some(&h), Logits::All).unwrap());
        hidden.extend_from_slice(&h);
    }
    assert_eq!(hidden.len(), prompt.len() * hd);

    // The same through the executors, which take at most `piece` tokens per forward call.
    let (mut a, _, _) = load(model(), "0:2");
    let (mut b, _, _) = load(model(), "3:output");
    a.engine.prefill_chunk = piece;
    b.engine.prefill_chunk = piece;
    let acts = match a.run(&req(&prompt, None, Want::Hidden)).unwrap().0 {
        Payload::Hidden { bits, data } => Activations { bits, data },
        p => panic!("expected hidden states, got {p:?}"),
    };
    let got: Vec<f32> = acts.data.chunks(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect();
    assert!(got.iter().zip(&hidden).all(|(x, y)| x.to_bits() == y.to_bits()), "hidden states differ from the pieces fed one by one");
    match b.run(&req(&prompt, Some(&acts), Want::AllLogits)).unwrap().0 {
        Payload::Logits(l) => assert!(l.len() == logits.len() && l.iter().zip(&logits).all(|(x, y)| x.to_bits() == y.to_bits())),
        p => panic!("expected logits, got {p:?}"),
    }
    assert_eq!(b.pos(1), prompt.len());

    // The last row only (a final prefill chunk at the last stage), and the greedy pick from it.
    let (mut b, _, _) = load(model(), "3:output");
    b.engine.prefill_chunk = piece;
    let n_vocab = cfg.n_vocab;
    let last = &logits[(prompt.len() - 1) * n_vocab..];
    match b.run(&req(&prompt, Some(&acts), Want::LastLogits)).unwrap().0 {
        Payload::Logits(l) => assert!(l.iter().zip(last).all(|(x, y)| x.to_bits() == y.to_bits()) && l.len() == n_vocab),
        p => panic!("expected logits, got {p:?}"),
    }
    // The session continues where the pieces left it: one more token, greedy.
    let next = [7u32];
    let more = StageRequest { pos: prompt.len(), prefix_hash: fnv1a_tokens(FNV_OFFSET, &prompt), ..req(&next, None, Want::Hidden) };
    let h1 = match a.run(&more).unwrap().0 {
        Payload::Hidden { bits, data } => Activations { bits, data },
        p => panic!("expected hidden states, got {p:?}"),
    };
    let step = StageRequest { pos: prompt.len(), prefix_hash: fnv1a_tokens(FNV_OFFSET, &prompt), ..req(&next, Some(&h1), Want::Greedy { top_logprobs: 0 }) };
    let (mut rb, _, _) = load(model(), "3:output");
    let mut kr = rb.stage().new_kv(CTX);
    let hin: Vec<f32> = h1.data.chunks(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect();
    for c in prompt.chunks(piece) {
        let s = (c.as_ptr() as usize - prompt.as_ptr() as usize) / 4;
        rb.engine.stage.forward(&mut kr, c, Some(&hidden[s * hd..(s + c.len()) * hd]), Logits::None).unwrap();
    }
    let want = rb.engine.stage.forward(&mut kr, &next, Some(&hin), Logits::Last).unwrap().to_vec();
    match b.run(&step).unwrap().0 {
        Payload::Token { id, .. } => assert_eq!(id, ds4_tokenizer::sampling::argmax(&want) as u32),
        p => panic!("expected a token, got {p:?}"),
    }
}
