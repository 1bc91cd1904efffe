//! A trained MTP block (`tools/reference/trained_tiny.py`: the copy-task model with an MTP block
//! trained under transformers, converted to the C engine's MTP layout): our MTP forward drafts the
//! tokens HF's block drafts wherever HF's margin is clear, speculative greedy decoding gives the plain
//! greedy tokens, and most drafts are accepted.
use ds4_engine::speculative::SpecSampler;
use ds4_engine::{Engine, GenStats, LoadOptions, MtpOptions, Session};
use ds4_model::Logits;
use ds4_tokenizer::sampling::{argmax, Sampler, SamplerConfig};
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;

fn fixture() -> PathBuf { PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../dist/tests/fixtures/copy_task") }

fn ids(v: &serde_json::Value) -> Vec<u32> { v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect() }

fn reference() -> serde_json::Value { serde_json::from_str(&std::fs::read_to_string(fixture().join("reference.json")).unwrap()).unwrap() }

fn load(mtp: Option<MtpOptions>) -> Engine {
    let opts = LoadOptions { ctx: 256, prefill_chunk: 8, quiet: true, mtp, ..LoadOptions::default() };
    Engine::load(&fixture().join("copy_q4.gguf"), &opts).unwrap()
}

#[test]
fn drafts_match_the_reference_block() {
    let r = reference();
    let mut eng = load(Some(MtpOptions { path: fixture().join("copy_mtp.gguf"), draft: 1, margin: 0.0 }));
    let (mut checked, mut clear) = (0, 0);
    for d in r["mtp"]["drafts"].as_array().unwrap() {
        let toks = ids(&d["tokens"]);
        let want = ids(&d["draft_argmax"]);
        let margins: Vec<f64> = d["draft_margin"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect();
        let n = toks.len();
        let mut kv = eng.new_kv();
        eng.forward(&mut kv, &toks, None, Logits::None).unwrap();
        let hd = eng.cfg().hc_dim();
        let hidden = eng.stage.hidden(n).to_vec();
        let m = eng.mtp.as_mut().unwrap();
        let mut mkv = m.model.new_kv(256);
        for i in 0..n - 1 {
            let l = m.model.forward(&eng.stage, &mut mkv, &hidden[i * hd..(i + 1) * hd], &toks[i + 1..i + 2], true).unwrap();
            let got = argmax(l);
            checked += 1;
            // Quantization (q4 experts, Q8_0 attention) moves logits by far less than a clear margin.
            if margins[i] > 1.0 {
                clear += 1;
                assert_eq!(got, want[i], "pair {i} of {toks:?}: draft {got}, HF {} (margin {:.2})", want[i], margins[i]);
            }
        }
    }
    eprintln!("{clear} of {checked} draft positions have an HF margin > 1 and match");
    assert!(clear * 2 > checked, "too few clear positions: {clear} of {checked}");
}

#[test]
fn trained_drafts_are_accepted_and_greedy_is_unchanged() {
    let r = reference();
    let mut plain = load(None);
    for draft in 1..=4 {
        let mut eng = load(Some(MtpOptions { path: fixture().join("copy_mtp.gguf"), draft, margin: 0.0 }));
        let mut st = GenStats::default();
        for p in r["prompts"].as_array().unwrap() {
            let prompt = ids(&p["prompt"]);
            let run = |eng: &mut Engine, spec: bool, st: &mut GenStats| {
                let mut s = Session::new(eng);
                s.sync(eng, &prompt, &mut |_, _| {}, &AtomicBool::new(false)).unwrap();
                let mut out = Vec::new();
                let mut g = Sampler::new(SamplerConfig::greedy());
                if spec {
                    s.generate_speculative(eng, 32, None, &mut g as &mut dyn SpecSampler, &mut |t| { out.push(t); true }, &AtomicBool::new(false), st).unwrap();
                } else {
                    s.generate(eng, 32, None, true, &mut |l| argmax(l), &mut |t| { out.push(t); true }, &AtomicBool::new(false), st).unwrap();
                }
                out
            };
            let want = run(&mut plain, false, &mut GenStats::default());
            let got = run(&mut eng, true, &mut st);
            assert_eq!(got, want, "draft {draft}: {prompt:?}");
            assert_eq!(want[..16], ids(&p["continuation"])[..], "the task's continuation");
        }
        eprintln!("draft {draft}: drafted {} accepted {} (acceptance {:.3})", st.drafted, st.accepted, st.acceptance());
        assert!(st.acceptance() > 0.5, "draft {draft}: a trained block should be accepted mostly: {st:?}");
    }
}
