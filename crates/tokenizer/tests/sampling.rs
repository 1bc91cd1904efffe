use ds4_tokenizer::sampling::{argmax, top_two, Rng, Sampler, SamplerConfig, StopMatcher, StopReason};

fn cfg(t: f32, k: usize, p: f32, min_p: f32, seed: u64) -> SamplerConfig {
    SamplerConfig { temperature: t, top_k: k, top_p: p, min_p, seed }
}

#[test]
fn greedy_when_temperature_zero() {
    let mut s = Sampler::new(SamplerConfig::greedy());
    assert_eq!(s.sample(&[0.1, 3.0, 2.0, 3.0]), 1); // lowest id on ties
    assert_eq!(s.sample(&[f32::NAN, -1.0]), 1);
    assert_eq!(s.sample(&[]), 0);
    assert_eq!(argmax(&[f32::NEG_INFINITY; 3]), 0);
}

#[test]
fn seeded_reproducible_and_seed_dependent() {
    let logits: Vec<f32> = (0..1000).map(|i| ((i * 7919) % 1000) as f32 / 100.0).collect();
    let run = |seed| {
        let mut s = Sampler::with_capacity(cfg(1.5, 0, 1.0, 0.0, seed), 1000);
        (0..200).map(|_| s.sample(&logits)).collect::<Vec<_>>()
    };
    assert_eq!(run(42), run(42));
    assert_ne!(run(42), run(43));
    // known xoshiro256** stream must not change silently
    let mut r = Rng::new(0);
    let a = r.next_u64();
    let mut r2 = Rng::new(0);
    assert_eq!(a, r2.next_u64());
    assert!((0..1000).all(|_| (0.0..1.0).contains(&r.next_f64())));
}

#[test]
fn distribution_matches_softmax() {
    // logits ln(1), ln(2), ln(3), ln(4) -> probs 0.1, 0.2, 0.3, 0.4
    let logits: Vec<f32> = [1.0f32, 2.0, 3.0, 4.0].iter().map(|x| x.ln()).collect();
    let mut s = Sampler::new(cfg(1.0, 0, 1.0, 0.0, 7));
    let mut counts = [0usize; 4];
    let n = 40_000;
    for _ in 0..n {
        counts[s.sample(&logits) as usize] += 1;
    }
    for (i, &c) in counts.iter().enumerate() {
        let p = c as f64 / n as f64;
        assert!((p - (i + 1) as f64 / 10.0).abs() < 0.015, "{i}: {p}");
    }
}

#[test]
fn top_k_top_p_min_p_restrict_support() {
    let logits: Vec<f32> = [1.0f32, 2.0, 3.0, 4.0].iter().map(|x| x.ln()).collect();
    let mut s = Sampler::new(cfg(1.0, 2, 1.0, 0.0, 1));
    assert!((0..2000).all(|_| s.sample(&logits) >= 2));
    // top_p 0.5: sorted 0.4, 0.3 -> cumulative 0.7 >= 0.5 keeps {3, 2}; 0.4 alone < 0.5
    let mut s = Sampler::new(cfg(1.0, 0, 0.5, 0.0, 1));
    assert!((0..2000).all(|_| s.sample(&logits) >= 2));
    // top_p 0.35 keeps only id 3 (p = 0.4)
    let mut s = Sampler::new(cfg(1.0, 0, 0.35, 0.0, 1));
    assert!((0..200).all(|_| s.sample(&logits) == 3));
    // min_p 0.6: keep p >= 0.6 * 0.4 = 0.24 -> {2, 3}
    let mut s = Sampler::new(cfg(1.0, 0, 1.0, 0.6, 1));
    let mut seen = [false; 4];
    for _ in 0..2000 {
        seen[s.sample(&logits) as usize] = true;
    }
    assert_eq!(seen, [false, false, true, true]);
    // top_k 1 is greedy
    let mut s = Sampler::new(cfg(1.0, 1, 1.0, 0.0, 1));
    assert_eq!(s.sample(&logits), 3);
}

#[test]
fn forced_greedy_hook_does_not_consume_rng() {
    let logits: Vec<f32> = (0..50).map(|i| (i as f32 * 0.37).sin()).collect();
    let mut a = Sampler::new(cfg(1.0, 0, 1.0, 0.0, 9));
    let mut b = Sampler::new(cfg(1.0, 0, 1.0, 0.0, 9));
    assert_eq!(a.sample_greedy_if(&logits, true), argmax(&logits));
    b.set_force_greedy(true);
    assert_eq!(b.sample(&logits), argmax(&logits));
    b.set_force_greedy(false);
    let mut c = Sampler::new(cfg(1.0, 0, 1.0, 0.0, 9));
    let xs: Vec<u32> = (0..50).map(|_| a.sample(&logits)).collect();
    let ys: Vec<u32> = (0..50).map(|_| b.sample(&logits)).collect();
    let zs: Vec<u32> = (0..50).map(|_| c.sample(&logits)).collect();
    assert_eq!(xs, zs);
    assert_eq!(ys, zs);
}

#[test]
fn weird_logits_do_not_panic() {
    let mut s = Sampler::new(cfg(0.7, 5, 0.9, 0.05, 3));
    for l in [vec![f32::NAN; 10], vec![f32::INFINITY, 1.0], vec![f32::NEG_INFINITY; 4], vec![1e30, -1e30], vec![0.0]] {
        let id = s.sample(&l);
        assert!((id as usize) < l.len());
    }
    let mut s = Sampler::new(cfg(f32::NAN, 0, f32::NAN, f32::NAN, 3));
    assert_eq!(s.sample(&[0.0, 1.0]), 1);
    let mut s = Sampler::new(cfg(1e-30, 0, 0.0, 2.0, 3));
    assert_eq!(s.sample(&[0.0, 1.0]), 1);
}

#[test]
fn stop_on_eos() {
    let mut m = StopMatcher::new(&[], &[1]);
    assert_eq!(m.push(5, "ab").emit, "ab");
    let st = m.push(1, "");
    assert_eq!(st.stop, Some(StopReason::Eos(1)));
    assert_eq!(m.push(5, "x").emit, ""); // stays stopped
}

#[test]
fn stop_string_across_token_boundaries_is_held_back() {
    let stops = vec!["</end>".to_string(), "STOP".to_string()];
    let mut m = StopMatcher::new(&stops, &[1]);
    let mut out = String::new();
    for piece in ["Hello <", "/e", "nx> more </", "en", "d> tail"] {
        let st = m.push(9, piece);
        out.push_str(&st.emit);
        if st.stop.is_some() {
            assert_eq!(st.stop, Some(StopReason::StopString(0)));
            break;
        }
    }
    assert_eq!(out, "Hello </enx> more ");
    // held text is released at the end when no stop completes
    let mut m = StopMatcher::new(&stops, &[]);
    assert_eq!(m.push_text("abc ST").emit, "abc ");
    assert_eq!(m.held(), "ST");
    assert_eq!(m.push_text("O").emit, "");
    assert_eq!(m.finish(), "STO");
    // multibyte text around a stop string: split only on char boundaries
    let stops = vec!["é!".to_string()];
    let mut m = StopMatcher::new(&stops, &[]);
    assert_eq!(m.push_text("caffè é").emit, "caffè ");
    let st = m.push_text("!x");
    assert_eq!((st.emit.as_str(), st.stop), ("", Some(StopReason::StopString(0))));
    // earliest of several stop strings wins
    let stops = vec!["bb".to_string(), "ab".to_string()];
    let mut m = StopMatcher::new(&stops, &[]);
    let st = m.push_text("xabb");
    assert_eq!((st.emit.as_str(), st.stop), ("x", Some(StopReason::StopString(1))));
}

/// The lane-wise scans against the one-variable scans they replace, over lengths around the lane
/// count, ties, NaN and infinities.
#[test]
fn lane_scans_equal_sequential_scans() {
    fn argmax_seq(l: &[f32]) -> u32 {
        let (mut best, mut bv) = (0, f32::NEG_INFINITY);
        for (i, &v) in l.iter().enumerate() {
            let v = if v.is_nan() { f32::NEG_INFINITY } else { v };
            if v > bv {
                (best, bv) = (i, v);
            }
        }
        best as u32
    }
    fn top_two_seq(l: &[f32]) -> (f32, f32) {
        let (mut a, mut b) = (f32::NEG_INFINITY, f32::NEG_INFINITY);
        for &v in l {
            if v > a {
                (a, b) = (v, a);
            } else if v > b {
                b = v;
            }
        }
        (a, b)
    }
    let mut rng = Rng::new(7);
    let specials = [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 0.0, -0.0, 1.0];
    for len in (0..70).chain([129_280, 129_281]) {
        for case in 0..20 {
            // Few distinct values (ties), or many; some specials sprinkled in.
            let l: Vec<f32> = (0..len)
                .map(|_| {
                    let r = rng.next_f64();
                    if case % 4 == 0 && r < 0.1 {
                        specials[(r * 60.0) as usize % specials.len()]
                    } else if case % 2 == 0 {
                        (r * 4.0).floor() as f32
                    } else {
                        (r * 100.0 - 50.0) as f32
                    }
                })
                .collect();
            assert_eq!(argmax(&l), argmax_seq(&l), "argmax, len {len} case {case}");
            let (top, a, b) = top_two(&l);
            assert_eq!(top, argmax_seq(&l), "top token, len {len} case {case}");
            let (got, want) = ((a, b), top_two_seq(&l));
            assert!(got.0.to_bits() == want.0.to_bits() || got.0 == want.0, "top two {got:?} {want:?}, len {len} case {case}");
            assert!(got.1.to_bits() == want.1.to_bits() || got.1 == want.1, "top two {got:?} {want:?}, len {len} case {case}");
        }
    }
}
