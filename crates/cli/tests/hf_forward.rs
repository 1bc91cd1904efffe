//! The forward pass against transformers' DeepseekV4ForCausalLM (fixtures by tools/reference/forward_fixtures.py):
//! the HF checkpoint is converted with our converter, run with exact f32 matmuls and the QAT simulation off
//! (transformers omits it), and compared at every stored position and after every layer.
use ds4_gguf::GgufFile;
use ds4_model::{Config, LayerRange, Logits, Options, Stage, Weights};
use ds4_quant::Precision;
use serde_json::Value;
use std::path::PathBuf;
use std::sync::Arc;

fn fixture_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../model/tests/fixtures/hf_tiny")
}

fn load_f32(name: &str) -> Vec<f32> {
    let b = std::fs::read(fixture_dir().join(name)).unwrap();
    b.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
}

fn usizes(v: &Value) -> Vec<usize> {
    v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as usize).collect()
}

#[test]
fn tiny_f32_matches_transformers() {
    let refj: Value = serde_json::from_str(&std::fs::read_to_string(fixture_dir().join("reference.json")).unwrap()).unwrap();
    let tokens: Vec<u32> = usizes(&refj["tokens"]).into_iter().map(|t| t as u32).collect();
    let lpos = usizes(&refj["logit_positions"]);
    let spos = usizes(&refj["state_positions"]);
    let out = std::env::temp_dir().join(format!("ds4-hf-tiny-{}.gguf", std::process::id()));
    ds4_convert::convert(&fixture_dir(), &out, ds4_convert::QuantMix::F32).expect("convert");
    let f = Arc::new(GgufFile::open(&out).unwrap());
    let cfg = Config::from_gguf(&f).unwrap();
    let w = Weights::bind(f, &cfg, LayerRange::full(&cfg)).unwrap();
    let mut st = Stage::new(cfg.clone(), w, Options { precision: Precision::Exact, qat: false });
    st.trace = Some(Vec::new());
    let mut kv = st.new_kv(tokens.len());
    let logits = st.forward(&mut kv, &tokens, None, Logits::All).unwrap().to_vec();
    let _ = std::fs::remove_file(&out);
    let v = cfg.n_vocab;
    let hd = cfg.hc_dim();

    // Layer by layer: HC state after each layer at the stored positions.
    let states = load_f32("hc_states.bin");
    let trace = st.trace.take().unwrap();
    let per_layer = spos.len() * hd;
    for l in 0..cfg.n_layer {
        let want = &states[(l + 1) * per_layer..(l + 2) * per_layer];
        let mut worst = 0f32;
        let mut scale = 0f32;
        for (j, &p) in spos.iter().enumerate() {
            let got = &trace[l][p * hd..(p + 1) * hd];
            let w = &want[j * hd..(j + 1) * hd];
            for (a, b) in got.iter().zip(w) {
                worst = worst.max((a - b).abs());
                scale = scale.max(b.abs());
            }
        }
        eprintln!("layer {l}: max |Δ state| = {worst:.3e} (max |state| {scale:.3})");
    }

    // Logits at every stored position.
    let want = load_f32("logits.bin");
    let max_abs = want.iter().fold(0f32, |m, x| m.max(x.abs()));
    let mut worst = 0f32;
    let mut argmax_ok = 0;
    for (i, &p) in lpos.iter().enumerate() {
        let got = &logits[p * v..(p + 1) * v];
        let w = &want[i * v..(i + 1) * v];
        let d = got.iter().zip(w).fold(0f32, |m, (a, b)| m.max((a - b).abs()));
        worst = worst.max(d);
        let am = |x: &[f32]| (0..x.len()).max_by(|&a, &b| x[a].total_cmp(&x[b])).unwrap();
        if am(got) == am(w) {
            argmax_ok += 1;
        } else {
            eprintln!("argmax differs at position {p}");
        }
    }
    eprintln!("logits: max |Δ| = {worst:.3e}, max |logit| = {max_abs:.3}, ratio {:.3e}; argmax {argmax_ok}/{}", worst / max_abs, lpos.len());
    assert_eq!(argmax_ok, lpos.len(), "argmax must match at every compared position");
    assert!(worst <= 1e-3 * max_abs, "max |Δlogit| {worst} exceeds 1e-3 × {max_abs}");
}

/// Quantized files (ds4 layout: Q8_0 attention/shared/output, F16 HC/compressor/indexer/router, Q4_K or
/// IQ2_XXS+Q2_K experts): transformers ran on the gguf-py dequantization of exactly these tensors, so our
/// exact (dequantized-weight) path must agree to the same bound; the fast path's error is reported.
#[test]
fn tiny_quantized_matches_transformers_on_dequantized_weights() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../model/tests/fixtures/hf_tiny_q");
    let refj: Value = serde_json::from_str(&std::fs::read_to_string(dir.join("reference.json")).unwrap()).unwrap();
    let tokens: Vec<u32> = usizes(&refj["tokens"]).into_iter().map(|t| t as u32).collect();
    let lpos = usizes(&refj["logit_positions"]);
    for mix in ["q4", "q2"] {
        let m = &refj["mixes"][mix];
        let f = Arc::new(GgufFile::open(dir.join(m["gguf"].as_str().unwrap())).unwrap());
        let want: Vec<f32> = std::fs::read(dir.join(m["logits"].as_str().unwrap()))
            .unwrap()
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        let max_abs = want.iter().fold(0f32, |a, x| a.max(x.abs()));
        for precision in [Precision::Exact, Precision::Fast] {
            let cfg = Config::from_gguf(&f).unwrap();
            let w = Weights::bind(f.clone(), &cfg, LayerRange::full(&cfg)).unwrap();
            let mut st = Stage::new(cfg.clone(), w, Options { precision, qat: false });
            let mut kv = st.new_kv(tokens.len());
            let logits = st.forward(&mut kv, &tokens, None, Logits::All).unwrap().to_vec();
            let v = cfg.n_vocab;
            let mut worst = 0f32;
            let mut argmax_ok = 0;
            for (i, &p) in lpos.iter().enumerate() {
                let got = &logits[p * v..(p + 1) * v];
                let w = &want[i * v..(i + 1) * v];
                worst = worst.max(got.iter().zip(w).fold(0f32, |a, (x, y)| a.max((x - y).abs())));
                let am = |x: &[f32]| (0..x.len()).max_by(|&a, &b| x[a].total_cmp(&x[b])).unwrap();
                argmax_ok += (am(got) == am(w)) as usize;
            }
            eprintln!("{mix} {precision:?}: max |Δlogit| {worst:.3e} ({:.3e} of max |logit| {max_abs:.3}); argmax {argmax_ok}/{}", worst / max_abs, lpos.len());
            if precision == Precision::Exact {
                assert_eq!(argmax_ok, lpos.len());
                assert!(worst <= 1e-3 * max_abs, "{mix}: {worst} > 1e-3 × {max_abs}");
            }
        }
    }
}
