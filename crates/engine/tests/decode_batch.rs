//! `Engine::decode_batch`: four greedy sessions stepped together (different prompt lengths, one joining
//! mid-stream, one cancelled mid-stream) produce exactly the tokens each produces alone.
use ds4_engine::{resolve_model, Engine, LoadOptions, Session};
use std::sync::atomic::AtomicBool;

fn argmax(l: &[f32]) -> u32 {
    let mut b = 0;
    for (i, &v) in l.iter().enumerate() {
        if v > l[b] {
            b = i;
        }
    }
    b as u32
}

fn prompt(n: usize, seed: u64, vocab: usize) -> Vec<u32> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((s >> 33) % vocab as u64) as u32
        })
        .collect()
}

/// Greedy tokens of `p` decoded alone, one `forward` per token.
fn alone(eng: &mut Engine, p: &[u32], steps: usize) -> Vec<u32> {
    let mut s = Session::new(eng);
    s.sync(eng, p, &mut |_, _| {}, &AtomicBool::new(false)).unwrap();
    let mut out = Vec::new();
    for _ in 0..steps {
        let t = argmax(&s.logits);
        out.push(t);
        s.step(eng, t).unwrap();
    }
    out
}

#[test]
fn four_greedy_sessions_batched_equal_alone() {
    let src = resolve_model(None).unwrap();
    let opts = LoadOptions { ctx: 1024, prefill_chunk: 64, quiet: true, kv_states: 4, ..LoadOptions::default() };
    let mut eng = Engine::load(src.path(), &opts).unwrap();
    assert!(eng.batched_decode());
    let v = eng.cfg().n_vocab;
    let lens = [3usize, 40, 150, 290];
    let steps = 20;
    let prompts: Vec<Vec<u32>> = lens.iter().enumerate().map(|(i, &n)| prompt(n, 100 + i as u64, v)).collect();
    let want: Vec<Vec<u32>> = prompts.iter().map(|p| alone(&mut eng, p, steps)).collect();

    let mut sess: Vec<Session> = prompts
        .iter()
        .map(|p| {
            let mut s = Session::new(&eng);
            s.sync(&mut eng, p, &mut |_, _| {}, &AtomicBool::new(false)).unwrap();
            s
        })
        .collect();
    let mut got: Vec<Vec<u32>> = vec![Vec::new(); 4];
    // Session 2 joins at step 6; session 0 is cancelled after 8 tokens.
    for step in 0..steps + 6 {
        let active: Vec<usize> = (0..4).filter(|&i| !(i == 2 && step < 6) && !(i == 0 && got[0].len() >= 8) && got[i].len() < steps).collect();
        if active.is_empty() {
            break;
        }
        let toks: Vec<u32> = active.iter().map(|&i| argmax(&sess[i].logits)).collect();
        let mut kvs: Vec<&mut ds4_model::KvState> = sess.iter_mut().enumerate().filter(|(i, _)| active.contains(i)).map(|(_, s)| &mut s.kv).collect();
        let rows = eng.decode_batch(&mut kvs, &toks).unwrap().to_vec();
        for (j, &i) in active.iter().enumerate() {
            got[i].push(toks[j]);
            sess[i].tokens.push(toks[j]);
            sess[i].logits = rows[j * v..(j + 1) * v].to_vec();
        }
    }
    for i in 0..4 {
        let n = if i == 0 { 8 } else { steps };
        assert_eq!(got[i], want[i][..n], "session {i}");
    }
    // The generated streams are not degenerate (the check would be vacuous on a constant model).
    assert!(want.iter().any(|w| w.iter().collect::<std::collections::HashSet<_>>().len() > 1));
}
