//! MTP speculative decoding: greedy output is token-for-token the output without MTP (drafts of every
//! length accepted and rejected, KV rolled back across ratio-4 and ratio-128 compressor boundaries and
//! after chunked prefills); the acceptance rule keeps the sampler's distribution (χ² test, and an
//! injected wrong rule fails it); bad MTP inputs are refused before anything runs.
use ds4_engine::speculative::{accept, draw};
use ds4_engine::{Engine, GenStats, LoadOptions, MtpOptions, Session, StopReason};
use ds4_model::synth::Mix;
use ds4_tokenizer::sampling::{Sampler, SamplerConfig};
use std::cell::Cell;
use std::rc::Rc;
use std::sync::atomic::AtomicBool;

mod common;
use common::*;

/// Greedy identity on one quant mix: prompt 100 (the first turn's 64 tokens cross the ratio-128 window
/// end at position 127 and many ratio-4 ones), prefill chunks of 32, a second turn crossing 255.
fn greedy_identity(mix: Mix, tag: &str) {
    let (model, mtp) = files(mix, tag);
    let mut plain = load(&model, None, 32);
    let v = plain.cfg().n_vocab;
    let prompt = tokens(100, 11, v);
    let extra = tokens(37, 12, v);
    let want = plain_turns(&mut plain, &prompt, &extra, 64);
    let flat: Vec<u32> = want.concat();
    for draft in 1..=4 {
        let mut eng = load(&model, Some(MtpOptions { path: mtp.clone(), draft, margin: 0.0 }), 32);
        // The MTP block's own (random-weight) drafts.
        let emitted = Rc::new(Cell::new(0));
        let mut st = GenStats::default();
        let got = spec_turns(&mut eng, &prompt, &extra, 64, &mut Greedy, &emitted, &mut st);
        assert_eq!(got, want, "{tag} draft {draft}: MTP greedy differs from plain greedy");
        assert!(st.drafted > 0, "{tag} draft {draft}: nothing was drafted");
        // Drafts right ~70 % of the time: accepted prefixes of every length, rejections at every depth.
        let (mut s, emitted) = right_seven_in_ten(flat.clone(), v, 99 + draft as u64);
        let mut st = GenStats::default();
        let got = spec_turns(&mut eng, &prompt, &extra, 64, &mut s, &emitted, &mut st);
        assert_eq!(got, want, "{tag} draft {draft}: oracle-drafted greedy differs from plain greedy");
        eprintln!("{tag} draft {draft}: oracle drafts {} accepted {} ({:.2})", st.drafted, st.accepted, st.acceptance());
        assert!(st.accepted > 0 && st.accepted < st.drafted, "{tag} draft {draft}: {st:?}");
        if draft > 1 {
            // Drafts of this length were fully accepted at least once (the tokens per verify exceed 2).
            assert!(st.accepted * 2 > st.drafted / draft, "{tag} draft {draft}: {st:?}");
        }
    }
}

#[test]
fn greedy_identity_q2() { greedy_identity(Mix::Q2, "q2"); }

#[test]
fn greedy_identity_q4() { greedy_identity(Mix::Q4, "q4"); }

/// `--mtp-margin` gates the drafts with the real greedy sampler: margin 0 drafts every step it can, a
/// margin no logit lead reaches drafts nothing, one in between no more than margin 0; the output is
/// plain greedy's every time.
#[test]
fn margin_gates_drafts_with_the_greedy_sampler() {
    let (model, mtp) = files(Mix::Q2, "q2");
    let mut plain = load(&model, None, 32);
    let v = plain.cfg().n_vocab;
    let prompt = tokens(100, 21, v);
    let extra = tokens(20, 22, v);
    let want = plain_turns(&mut plain, &prompt, &extra, 40);
    let mut drafted = Vec::new();
    for margin in [0.0, 0.5, f32::MAX] {
        let mut eng = load(&model, Some(MtpOptions { path: mtp.clone(), draft: 2, margin }), 32);
        let mut sampler = Sampler::new(SamplerConfig::greedy());
        let (emitted, mut st) = (Rc::new(Cell::new(0)), GenStats::default());
        let got = spec_turns(&mut eng, &prompt, &extra, 40, &mut sampler, &emitted, &mut st);
        assert_eq!(got, want, "margin {margin}: MTP greedy differs from plain greedy");
        eprintln!("margin {margin}: drafted {} accepted {}", st.drafted, st.accepted);
        drafted.push(st.drafted);
    }
    assert!(drafted[0] > 0, "margin 0 drafted nothing");
    assert!(drafted[1] <= drafted[0], "a margin drafted more than margin 0: {drafted:?}");
    assert_eq!(drafted[2], 0, "an unreachable margin still drafted");
}

/// Stops inside an accepted run (EOS, caller) leave the session exactly as plain decoding does.
#[test]
fn stops_inside_accepted_drafts() {
    let (model, mtp) = files(Mix::Q2, "q2");
    let mut plain = load(&model, None, 64);
    let v = plain.cfg().n_vocab;
    let prompt = tokens(50, 5, v);
    let want = plain_turns(&mut plain, &prompt, &[], 30).remove(0);
    let mut eng = load(&model, Some(MtpOptions { path: mtp, draft: 4, margin: 0.0 }), 64);
    for stop_at in [3usize, 6, 13] {
        for eos in [true, false] {
            let mut s = Session::new(&eng);
            s.sync(&mut eng, &prompt, &mut |_, _| {}, &AtomicBool::new(false)).unwrap();
            let truth = want.clone();
            let (mut o, emitted) = ds4_engine::ScriptedDrafts::new(move |n| truth.get(n).copied().unwrap_or(0));
            let mut got = Vec::new();
            let mut st = GenStats::default();
            let e = emitted.clone();
            let eos_tok = eos.then(|| want[stop_at]);
            let r = s
                .generate_speculative(&mut eng, 30, eos_tok, &mut o, &mut |t| { got.push(t); e.set(got.len()); got.len() <= stop_at || eos }, &AtomicBool::new(false), &mut st)
                .unwrap();
            let first = want.iter().position(|&t| Some(t) == eos_tok).unwrap_or(usize::MAX);
            if eos {
                assert_eq!(r, StopReason::Eos);
                assert_eq!(got, want[..first]);
                assert_eq!(s.tokens.len(), prompt.len() + first, "EOS is not fed");
            } else {
                assert_eq!(r, StopReason::Caller);
                assert_eq!(got, want[..stop_at + 1]);
                assert_eq!(s.tokens.len(), prompt.len() + stop_at, "the refused token is not fed");
            }
            // The state continues exactly like plain decoding from there.
            let mut p2 = Session::new(&plain);
            p2.sync(&mut plain, &s.tokens, &mut |_, _| {}, &AtomicBool::new(false)).unwrap();
            assert_eq!(p2.logits, s.logits, "logits after the stop");
            assert!(st.accepted > 0);
        }
    }
}

/// χ² over 8 categories at the 1 % level (df = categories - 1).
fn chi2_ok(counts: &[f64], probs: &[f64]) -> (f64, bool) {
    const CRIT: [f64; 8] = [0.0, 6.635, 9.210, 11.345, 13.277, 15.086, 16.812, 18.475];
    let n: f64 = counts.iter().sum();
    let stat: f64 = counts.iter().zip(probs).map(|(&c, &p)| (c - n * p).powi(2) / (n * p)).sum();
    (stat, stat < CRIT[counts.len() - 1])
}

/// The first speculative token: draft d ~ q (the sampler's distribution of the MTP logits), accepted or
/// resampled against p (the sampler's distribution of the main model's logits at that position), over
/// 20 000 draws; the counts must fit p. The rule applied with a wrong residual (p instead of p − q) and
/// with always-accept must not.
#[test]
fn acceptance_rule_keeps_the_distribution() {
    let (model, mtp) = files(Mix::Q2, "q2");
    let mut eng = load(&model, Some(MtpOptions { path: mtp, draft: 1, margin: 0.0 }), 64);
    let v = eng.cfg().n_vocab;
    let prompt = tokens(40, 21, v);
    let mut s = Session::new(&eng);
    s.sync(&mut eng, &prompt, &mut |_, _| {}, &AtomicBool::new(false)).unwrap();
    // p: main logits after the first generated token; q: the MTP's logits for the same position.
    let cfg = SamplerConfig { temperature: 1.0, top_k: 8, top_p: 1.0, min_p: 0.0, seed: 3 };
    let mut sampler = Sampler::new(cfg);
    let first = sampler.sample(&s.logits);
    let mut q_logits = Vec::new();
    {
        let hd = eng.cfg().hc_dim();
        let hidden = eng.stage.hidden(1).to_vec();
        assert_eq!(hidden.len(), hd);
        let mut mkv = eng.mtp.as_ref().unwrap().model.new_kv(CTX);
        let m = &mut eng.mtp.as_mut().unwrap().model;
        q_logits.extend_from_slice(m.forward(&eng.stage, &mut mkv, &hidden, &[first], true).unwrap());
    }
    s.step(&mut eng, first).unwrap();
    // Mix the main logits into the draft's so that p and q overlap (random weights share no top-8).
    let mixed: Vec<f32> = q_logits.iter().zip(&s.logits).map(|(a, b)| 0.5 * a + b).collect();
    let (mut p, mut q) = (Vec::new(), Vec::new());
    sampler.distribution(&s.logits, false, &mut p);
    Sampler::new(SamplerConfig { temperature: 1.5, top_k: 8, ..cfg }).distribution(&mixed, false, &mut q);
    let overlap: f32 = p.iter().map(|&(id, pp)| pp.min(q.iter().find(|x| x.0 == id).map_or(0.0, |x| x.1))).sum();
    eprintln!("p {p:?}\nq {q:?}\noverlap {overlap:.3}");
    assert!(overlap > 0.2 && overlap < 0.95, "p and q should overlap partly, got {overlap}");
    let ids: Vec<u32> = p.iter().map(|x| x.0).collect();
    let probs: Vec<f64> = p.iter().map(|x| x.1 as f64).collect();
    let mut rng = ds4_tokenizer::sampling::Rng::new(12345);
    let n = 20_000;
    let mut run = |rule: &dyn Fn(&[(u32, f32)], &[(u32, f32)], u32, &mut dyn FnMut() -> f64) -> u32| {
        let mut counts = vec![0f64; ids.len()];
        let mut u = || rng.next_f64();
        for _ in 0..n {
            let d = draw(&q, u());
            let t = rule(&p, &q, d, &mut u);
            let k = ids.iter().position(|&i| i == t).expect("outside p's support");
            counts[k] += 1.0;
        }
        counts
    };
    let right = run(&|p, q, d, u| match accept(p, q, d, u) {
        Ok(t) | Err(t) => t,
    });
    let (stat, ok) = chi2_ok(&right, &probs);
    eprintln!("speculative rule: χ² {stat:.2} over {} categories", ids.len());
    assert!(ok, "the speculative rule changed the distribution: χ² {stat}");
    // Injected wrong rule 1: on rejection, draw from p instead of the residual.
    let wrong = run(&|p, q, d, u| match accept(p, q, d, u) {
        Ok(t) => t,
        Err(_) => draw(p, u()),
    });
    let (stat, ok) = chi2_ok(&wrong, &probs);
    eprintln!("wrong residual: χ² {stat:.2}");
    assert!(!ok, "a wrong residual passed the test (χ² {stat})");
    // Injected wrong rule 2: accept every draft that p allows.
    let wrong = run(&|p, q, d, u| {
        if p.iter().any(|x| x.0 == d) {
            d
        } else {
            match accept(p, q, d, u) {
                Ok(t) | Err(t) => t,
            }
        }
    });
    let (stat, ok) = chi2_ok(&wrong, &probs);
    eprintln!("always accept: χ² {stat:.2}");
    assert!(!ok, "always-accept passed the test (χ² {stat})");
}

#[test]
fn bad_mtp_inputs_are_refused_before_loading() {
    let (model, mtp) = files(Mix::Q2, "q2");
    let opts = |m: MtpOptions| LoadOptions { ctx: CTX, quiet: true, mtp: Some(m), ..LoadOptions::default() };
    for draft in [0, 5] {
        let e = Engine::plan(&model, &opts(MtpOptions { path: mtp.clone(), draft, margin: 3.0 })).err().expect("refused");
        assert!(e.to_string().contains("--mtp-draft must be between 1 and 4"), "{e}");
    }
    for margin in [-1.0, f32::NAN] {
        let e = Engine::plan(&model, &opts(MtpOptions { path: mtp.clone(), draft: 1, margin })).err().expect("refused");
        assert!(e.to_string().contains("--mtp-margin"), "{e}");
    }
    // The main model is not an MTP file.
    let e = Engine::plan(&model, &opts(MtpOptions { path: model.clone(), draft: 1, margin: 3.0 })).err().expect("refused");
    assert!(e.to_string().contains("is not an MTP file"), "{e}");
    // An MTP file whose `enorm` is half the model's width.
    let dir = std::env::temp_dir().join(format!("ds4-mtp-test-{}", std::process::id()));
    let other = dir.join("narrow-mtp.gguf");
    {
        let f = ds4_gguf::GgufFile::open(&mtp).unwrap();
        let mut w = ds4_gguf::GgufWriter::new();
        let half = vec![0u8; 4 * 128];
        let mut data: Vec<&[u8]> = Vec::new();
        for t in f.tensors() {
            if t.name == "mtp.0.enorm.weight" {
                w.add_tensor_info(&t.name, t.ty, &[128]).unwrap();
                data.push(&half);
            } else {
                w.add_tensor_info(&t.name, t.ty, &t.dims).unwrap();
                data.push(f.tensor_data(t));
            }
        }
        std::fs::write(&other, w.to_bytes(&data).unwrap()).unwrap();
    }
    let e = Engine::plan(&model, &opts(MtpOptions { path: other.clone(), draft: 1, margin: 3.0 })).err().expect("refused");
    assert!(e.to_string().contains("does not match the model") && e.to_string().contains("enorm"), "{e}");
    // A missing file.
    let e = Engine::plan(&model, &opts(MtpOptions { path: dir.join("nope.gguf"), draft: 1, margin: 3.0 })).err().expect("refused");
    assert!(e.to_string().contains("nope.gguf"), "{e}");
    // A layer range without the head (a distributed stage).
    let mut o = opts(MtpOptions { path: mtp.clone(), draft: 1, margin: 3.0 });
    o.layers = Some(ds4_model::LayerRange { first: 0, last: 2, embed: true, head: false });
    let e = Engine::plan(&model, &o).err().expect("refused");
    assert!(e.to_string().contains("distributed route"), "{e}");
}
