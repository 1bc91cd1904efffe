//! Routes of 1, 2 and 3 stages on loopback against the single-process reference.
mod common;
use common::*;
use std::time::{Duration, Instant};

const CHUNK: usize = 16;
const N_GEN: usize = 8;

/// Runs prompt + greedy decode on the route; returns tokens and the logits after every step.
fn run_route(s: &mut ds4_dist::DistSession, prompt: &[u32], n_gen: usize) -> (Vec<u32>, Vec<Vec<f32>>) {
    let mut logits = s.sync(prompt).unwrap().to_vec();
    let mut toks = Vec::new();
    let mut all = vec![logits.clone()];
    for _ in 0..n_gen {
        let t = argmax(&logits);
        toks.push(t);
        logits = s.step(t).unwrap().to_vec();
        all.push(logits.clone());
    }
    (toks, all)
}

fn margin(l: &[f32]) -> f32 {
    let t = argmax(l) as usize;
    let second = l.iter().enumerate().filter(|(i, _)| *i != t).fold(f32::MIN, |m, (_, &v)| m.max(v));
    l[t] - second
}

fn max_err(a: &[Vec<f32>], b: &[Vec<f32>]) -> f32 {
    a.iter().zip(b).flat_map(|(x, y)| x.iter().zip(y).map(|(p, q)| (p - q).abs())).fold(0f32, nan_max)
}

fn route_case(stages: &[&str], bits: u8) -> (Vec<u32>, Vec<Vec<f32>>, ds4_dist::DistSession, Vec<ThreadWorker>) {
    let to = Duration::from_secs(5);
    let (c, local) = coordinator(stages[0], bits, None, to, CHUNK);
    let workers: Vec<_> = stages[1..].iter().map(|l| thread_worker(model(), l, &c.addr, None, to)).collect();
    c.coord.wait_complete(Duration::from_secs(20)).expect("route completes");
    let mut s = session(&c, local, bits, CHUNK);
    let p = prompt(70, 1);
    let (t, l) = run_route(&mut s, &p, N_GEN);
    (t, l, s, workers)
}

#[test]
fn two_and_three_stage_routes_are_bit_identical_at_32_bits() {
    let p = prompt(70, 1);
    let (rt, rl) = reference(&p, CHUNK, N_GEN);
    for stages in [&["0:2", "3:output"][..], &["0:1", "2:3", "4:output"][..]] {
        let t0 = Instant::now();
        let (t, l, s, _w) = route_case(stages, 32);
        assert_eq!(t, rt, "greedy tokens of route {stages:?}");
        assert_eq!(max_err(&l, &rl), 0.0, "logits of route {stages:?}");
        assert!(l.iter().zip(&rl).all(|(a, b)| a == b));
        // Telemetry: one line per hop per request, plus the coordinator's local layers.
        let recs: Vec<_> = s.telemetry.records().collect();
        assert!(recs.iter().any(|r| r.hop.is_none()));
        assert!(recs.iter().any(|r| r.hop == Some(stages.len() - 1)));
        let line = recs[recs.len() - 1].line();
        for f in ["request=", "hop=", "layers=", "pos=", "tokens=", "eval=", "downstream_wait=", "forward_send=", "input=", "output="] {
            assert!(line.contains(f), "{line}");
        }
        eprintln!("route {stages:?}: identical over {} prompt + {N_GEN} generated tokens in {:.2}s", p.len(), t0.elapsed().as_secs_f64());
    }
}

#[test]
fn busy_polling_waits_give_the_same_route() {
    // --dist-spin-us: both ends poll before blocking (process-wide; other tests here only spin too).
    ds4_dist::spin::set(Duration::from_millis(20));
    let p = prompt(70, 1);
    let (rt, rl) = reference(&p, CHUNK, N_GEN);
    let (t, l, _s, _w) = route_case(&["0:2", "3:output"], 32);
    ds4_dist::spin::set(Duration::ZERO);
    assert_eq!(t, rt);
    assert_eq!(max_err(&l, &rl), 0.0);
}

#[test]
fn compact_activations_keep_greedy_tokens_and_report_logit_error() {
    for seed in [1u32, 2] {
        let p = prompt(70, seed);
        let (rt, rl) = reference(&p, CHUNK, N_GEN);
        for bits in [16u8, 8] {
            let to = Duration::from_secs(5);
            let (c, local) = coordinator("0:1", bits, None, to, CHUNK);
            let _w = [thread_worker(model(), "2:3", &c.addr, None, to), thread_worker(model(), "4:output", &c.addr, None, to)];
            c.coord.wait_complete(Duration::from_secs(20)).unwrap();
            let mut s = session(&c, local, bits, CHUNK);
            // Greedy decode with the reference's tokens fed (so errors don't compound through choices).
            let mut l = vec![s.sync(&p).unwrap().to_vec()];
            for &t in &rt {
                l.push(s.step(t).unwrap().to_vec());
            }
            let picks: Vec<u32> = l[..N_GEN].iter().map(|x| argmax(x)).collect();
            let scale = rl.iter().flatten().fold(0f32, |m, v| m.max(v.abs()));
            let e = max_err(&l, &rl);
            // Fixed bounds, set from measurement on this random (near-chaotic) model, not from the error
            // of the run: max |dlogit| of max |logit| measured 3.6e-2 / 2.8e-1 (16-bit, prompts 1 / 2) and
            // 2.5e-1 / 3.5e-1 (8-bit). A position whose reference top-1/top-2 gap is below twice the bound
            // is a near-tie: reported, not asserted. (The trained model's test carries the tight claims.)
            let bound = if bits == 16 { 0.40 } else { 0.50 } * scale;
            assert!(e <= bound, "{bits}-bit max |dlogit| {e:.3} exceeds the fixed bound {bound:.3}");
            let mut ties = Vec::new();
            for (i, (&a, &b)) in picks.iter().zip(&rt).enumerate() {
                let m = margin(&rl[i]);
                if m <= 2.0 * bound {
                    ties.push((i, m, a == b));
                } else {
                    assert_eq!(a, b, "{bits}-bit greedy token at step {i} (reference margin {m:.3}, error {e:.3})");
                }
            }
            eprintln!(
                "activation bits {bits}, prompt {seed}: max |dlogit| {e:.3e} ({:.3e} of max |logit| {scale:.2}); greedy tokens {}; near-ties (step, margin, same) {ties:?}",
                e / scale,
                if picks == rt { "all match" } else { "differ at a near-tie" }
            );
            assert!(e > 0.0);
        }
    }
}

#[test]
fn last_stage_greedy_returns_the_token_id_and_logprobs() {
    let p = prompt(40, 3);
    let (rt, rl) = reference(&p, CHUNK, 4);
    let to = Duration::from_secs(5);
    let (c, local) = coordinator("0:2", 32, None, to, CHUNK);
    let _w = thread_worker(model(), "3:output", &c.addr, None, to);
    c.coord.wait_complete(Duration::from_secs(20)).unwrap();
    let mut s = session(&c, local, 32, CHUNK);
    let mut next = argmax(s.sync(&p).unwrap());
    assert_eq!(next, rt[0]);
    for i in 1..4 {
        let o = s.step_greedy(next, 3).unwrap();
        assert_eq!(o.id, rt[i]);
        assert_eq!(o.top.len(), 3);
        assert_eq!(o.top[0].0, o.id);
        let l = &rl[i];
        let m = l.iter().fold(f32::MIN, |a, &b| a.max(b));
        let lse = m + l.iter().map(|v| (v - m).exp()).sum::<f32>().ln();
        assert!((o.logprob - (l[o.id as usize] - lse)).abs() < 1e-4);
        next = o.id;
    }
    // Decode traffic: a greedy step returns a few bytes instead of the logits vector.
    let last = s.telemetry.records().last().unwrap().clone();
    assert!(last.timing.output_bytes < 64, "{}", last.line());
}

#[test]
fn single_process_route_and_prefix_reuse() {
    let p = prompt(50, 4);
    let (rt, rl) = reference(&p, CHUNK, 3);
    let (local, _, _) = load(model(), "0:output");
    let mut s = ds4_dist::DistSession::new(local, None, ds4_dist::RouteOptions { prefill_chunk: CHUNK, ..Default::default() });
    let (t, l) = run_route(&mut s, &p, 3);
    assert_eq!(t, rt);
    assert_eq!(l, rl);
    // Extending the history prefills only the new tokens.
    let mut longer = s.tokens.clone();
    longer.extend_from_slice(&[5, 6, 7]);
    s.sync(&longer).unwrap();
    assert_eq!(s.tokens, longer);
}

/// A cancelled prefill stops between chunks with an error, on a remote route (pipelined) and on a
/// single local stage; the session stays usable: the next prefill gives the reference's logits.
#[test]
fn cancelled_prefill_stops_and_the_session_recovers() {
    use std::sync::atomic::AtomicBool;
    let p = prompt(60, 5);
    let (_, rl) = reference(&p, CHUNK, 0);
    let to = Duration::from_secs(5);
    let (c, local) = coordinator("0:2", 32, None, to, CHUNK);
    let _w = thread_worker(model(), "3:output", &c.addr, None, to);
    c.coord.wait_complete(Duration::from_secs(20)).unwrap();
    let mut s = session(&c, local, 32, CHUNK);
    let (single, _, _) = load(model(), "0:output");
    let mut one = ds4_dist::DistSession::new(single, None, ds4_dist::RouteOptions { prefill_chunk: CHUNK, ..Default::default() });
    for s in [&mut s, &mut one] {
        // Half of the prompt first, so the cancelled span extends a history.
        s.sync(&p[..30]).unwrap();
        let e = s.sync_cancellable(&p, &AtomicBool::new(true)).unwrap_err().to_string();
        assert!(e.contains(ds4_dist::route::CANCELLED), "{e}");
        assert_eq!(s.tokens, &p[..30], "nothing of the cancelled span is committed");
        assert_eq!(s.sync(&p).unwrap(), &rl[0][..]);
    }
}

/// Pipelined prefill (micro-chunks in flight through 2 and 3 stages) gives bit-identical logits to
/// the unpipelined single process at the same chunking, and to the same route with one chunk in
/// flight: prompts that end mid-chunk and cross the compressor's 128-token blocks (chunks of 48
/// and 80 put the block edges 128, 256 inside chunks).
#[test]
fn pipelined_prefill_is_bit_identical_for_ragged_prompts_across_compressor_blocks() {
    let to = Duration::from_secs(5);
    for (stages, len, chunk) in [(&["0:2", "3:output"][..], 301usize, 48usize), (&["0:1", "2:3", "4:output"][..], 263, 80)] {
        let p = prompt(len, 9);
        assert!(len % chunk != 0 && len > 256);
        let (rt, rl) = reference(&p, chunk, 2);
        let (c, local) = coordinator(stages[0], 32, None, to, chunk);
        let _w: Vec<_> = stages[1..].iter().map(|l| thread_worker(model(), l, &c.addr, None, to)).collect();
        c.coord.wait_complete(Duration::from_secs(20)).unwrap();
        let mut s = session(&c, local, 32, chunk);
        for window in [None, Some(1)] {
            s.reset();
            s.opts.prefill_window = window;
            s.telemetry.clear();
            let l = s.sync(&p).unwrap().to_vec();
            assert!(l.iter().zip(&rl[0]).all(|(a, b)| a.to_bits() == b.to_bits()), "prefill logits of {stages:?}, window {window:?}");
            // Prefill telemetry: every stage's every chunk, with its index.
            let n = len.div_ceil(chunk);
            let recs: Vec<_> = s.telemetry.records().filter(|r| r.chunk.is_some()).collect();
            assert_eq!(recs.len(), n * stages.len(), "one record per chunk per stage");
            assert!(recs.iter().any(|r| r.chunk == Some((n - 1, n)) && r.tokens == len % chunk && r.hop == Some(stages.len() - 1)));
            assert!(recs[0].line().contains(&format!("prefill chunk=1/{n}")), "{}", recs[0].line());
            assert_eq!(s.step(rt[0]).unwrap(), &rl[1][..], "decode after the pipelined prefill");
        }
    }
    // The totals for /metrics saw prefill chunks on remote hops.
    let m = ds4_dist::telemetry::prometheus();
    assert!(m.contains("ds4_dist_hop_send_seconds_total{phase=\"prefill\",hop=\"1\""), "{m}");
}

/// The micro-chunk picked from measured costs (no --dist-prefill-chunk): after a first prefill in the
/// engine's chunk, the cost model has samples; the route stays bit-identical to the single process
/// at whatever chunking it picked (printed), and a 16-bit prefill with 32-bit decode is accepted.
#[test]
fn auto_micro_chunk_and_prefill_bits() {
    let to = Duration::from_secs(5);
    let (c, local) = coordinator("0:2", 32, None, to, 256);
    let _w = thread_worker(model(), "3:output", &c.addr, None, to);
    c.coord.wait_complete(Duration::from_secs(20)).unwrap();
    let mut s = session(&c, local, 32, 256);
    s.opts.auto_chunk = true;
    let p = prompt(400, 11);
    s.sync(&p).unwrap();
    let fit = s.costs.fit().expect("two chunk sizes measured (256 and 144)");
    let picked = ds4_dist::prefill_plan::micro_chunk(p.len(), 2, 256, Some(fit));
    let (_, rl) = reference(&p, picked, 0);
    s.reset();
    assert_eq!(s.sync(&p).unwrap(), &rl[0][..], "auto micro-chunk {picked}");
    eprintln!("auto micro-chunk {picked} (fit {fit:?})");
    s.reset();
    s.opts.prefill_bits = Some(16);
    let l16 = s.sync(&p).unwrap().to_vec();
    let e = l16.iter().zip(&rl[0]).map(|(a, b)| (a - b).abs()).fold(0f32, nan_max);
    assert!(e > 0.0, "the 16-bit prefill went over the wire in 16 bits");
}
