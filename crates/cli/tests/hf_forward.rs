//! The forward pass against transformers' DeepseekV4ForCausalLM (fixtures by tools/reference/forward_fixtures.py):
//! the HF checkpoint is converted with our converter, run with exact f32 matmuls and the QAT simulation off
//! (transformers omits it), and compared at every stored position and after every layer.
use ds4_gguf::GgufFile;
use ds4_model::{Config, LayerRange, Logits, Options, Stage, Weights};
use ds4_quant::Precision;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::sync::Arc;

fn fixture_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../model/tests/fixtures/hf_tiny")
}

fn load_f32(dir: &Path, name: &str) -> Vec<f32> {
    let b = std::fs::read(dir.join(name)).unwrap();
    b.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
}

fn usizes(v: &Value) -> Vec<usize> {
    v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as usize).collect()
}

/// A router or indexer top-k margin under this is a near-tie: an engine as exact as f32 allows may pick
/// the other expert or row there, so positions at or after one are reported, not asserted.
const NEAR_TIE: f32 = 1e-5;

/// What one comparison measured.
struct Measured {
    /// max |Δlogit| over the asserted positions, and the largest |logit| of the reference.
    logit_err: f32,
    max_logit: f32,
    argmax_ok: usize,
    asserted: usize,
    /// per layer: max |Δ HC state| / max |state| over the asserted stored positions.
    state_rel: Vec<f32>,
    /// median and 99th percentile over positions of max |Δlogit|, relative to max |logit|.
    median_rel: f32,
    p99_rel: f32,
}

/// The first position from which a near-tie (in any layer's router or indexer) can change what later
/// positions see; the sequence is compared before it.
fn first_near_tie(dir: &Path, n_layer: usize, s: usize) -> usize {
    let mut first = s;
    for f in ["router_margin.bin", "indexer_margin.bin"] {
        let m = load_f32(dir, f);
        for l in 0..n_layer {
            if let Some(p) = (0..s).find(|&p| m[l * s + p] < NEAR_TIE) {
                eprintln!("{}: {f} layer {l} near-tie {:.3e} at position {p}", dir.display(), m[l * s + p]);
                first = first.min(p);
            }
        }
    }
    first
}

/// The directional steering a fixture was made with (`steering.json`: slots of file, ffn and attn
/// scale), loaded as `--dir-steering-file F --dir-steering-ffn S --dir-steering-attn S` would.
fn steering_of(dir: &Path, cfg: &Config) -> Option<Arc<ds4_model::steering::Steering>> {
    let j: Value = serde_json::from_str(&std::fs::read_to_string(dir.join("steering.json")).ok()?).unwrap();
    let specs: Vec<_> = j["slots"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| ds4_model::steering::SteerSpec { file: dir.join(s["file"].as_str().unwrap()), ffn: s["ffn"].as_f64().unwrap() as f32, attn: s["attn"].as_f64().unwrap() as f32 })
        .collect();
    Some(Arc::new(ds4_model::steering::Steering::load(&specs, cfg.n_layer, cfg.n_embd).unwrap()))
}

/// Runs the converted tiny checkpoint over the reference tokens (one prefill, exact f32 products) with
/// the QAT simulation on or off and compares every position's logits and the stored HC states.
fn compare_tiny(dir: &Path, qat: bool) -> Measured {
    let refj: Value = serde_json::from_str(&std::fs::read_to_string(dir.join("reference.json")).unwrap()).unwrap();
    assert_eq!(refj["qat"].as_bool(), Some(qat), "{}: fixture made with qat={:?}", dir.display(), refj["qat"]);
    let tokens: Vec<u32> = usizes(&refj["tokens"]).into_iter().map(|t| t as u32).collect();
    let lpos = usizes(&refj["logit_positions"]);
    let spos = usizes(&refj["state_positions"]);
    let out = std::env::temp_dir().join(format!("ds4-hf-tiny-{}-{qat}.gguf", std::process::id()));
    ds4_convert::convert(&fixture_dir(), &out, ds4_convert::QuantMix::F32).expect("convert");
    let f = Arc::new(GgufFile::open(&out).unwrap());
    let cfg = Config::from_gguf(&f).unwrap();
    assert_eq!(cfg.swa, refj["sliding_window"].as_u64().unwrap() as usize);
    let w = Weights::bind(f, &cfg, LayerRange::full(&cfg)).unwrap();
    let mut st = Stage::new(cfg.clone(), w, Options { precision: Precision::Exact, qat });
    st.trace = Some(Vec::new());
    st.steering = steering_of(dir, &cfg);
    let mut kv = st.new_kv(tokens.len());
    let logits = st.forward(&mut kv, &tokens, None, Logits::All).unwrap().to_vec();
    let _ = std::fs::remove_file(&out);
    let (v, hd) = (cfg.n_vocab, cfg.hc_dim());
    let upto = first_near_tie(dir, cfg.n_layer, tokens.len());

    // Layer by layer: HC state after each layer at the stored positions.
    let states = load_f32(dir, "hc_states.bin");
    let trace = st.trace.take().unwrap();
    let per_layer = spos.len() * hd;
    let mut state_rel = Vec::new();
    for l in 0..cfg.n_layer {
        let want = &states[(l + 1) * per_layer..(l + 2) * per_layer];
        let (mut worst, mut scale) = (0f32, 0f32);
        for (j, &p) in spos.iter().enumerate().filter(|&(_, &p)| p < upto) {
            let got = &trace[l][p * hd..(p + 1) * hd];
            for (a, b) in got.iter().zip(&want[j * hd..(j + 1) * hd]) {
                worst = worst.max((a - b).abs());
                scale = scale.max(b.abs());
            }
        }
        eprintln!("layer {l}: max |Δ state| = {worst:.3e} (max |state| {scale:.3}, relative {:.3e})", worst / scale);
        state_rel.push(worst / scale);
    }

    // Logits at every position before the first near-tie.
    let want = load_f32(dir, "logits.bin");
    let max_logit = want.iter().fold(0f32, |m, x| m.max(x.abs()));
    let (mut logit_err, mut argmax_ok, mut asserted) = (0f32, 0, 0);
    let mut per_pos = Vec::new();
    let am = |x: &[f32]| (0..x.len()).max_by(|&a, &b| x[a].total_cmp(&x[b])).unwrap();
    for (i, &p) in lpos.iter().enumerate().filter(|&(_, &p)| p < upto) {
        let got = &logits[p * v..(p + 1) * v];
        let w = &want[i * v..(i + 1) * v];
        let e = got.iter().zip(w).fold(0f32, |m, (a, b)| nan_max(m, (a - b).abs()));
        per_pos.push(e);
        logit_err = nan_max(logit_err, e);
        asserted += 1;
        if am(got) == am(w) {
            argmax_ok += 1;
        } else {
            eprintln!("argmax differs at position {p}");
        }
    }
    eprintln!(
        "{}: logits max |Δ| = {logit_err:.3e}, max |logit| = {max_logit:.3}, ratio {:.3e}; argmax {argmax_ok}/{asserted} (positions {upto}..{} after a near-tie not asserted)",
        dir.display(),
        logit_err / max_logit,
        tokens.len()
    );
    per_pos.sort_by(f32::total_cmp);
    let q = |f: f64| per_pos[((per_pos.len() - 1) as f64 * f).round() as usize] / max_logit;
    let (median_rel, p99_rel) = (q(0.5), q(0.99));
    eprintln!("  per-position max |Δlogit| / max |logit|: median {median_rel:.3e}, p99 {p99_rel:.3e}");
    Measured { logit_err, max_logit, argmax_ok, asserted, state_rel, median_rel, p99_rel }
}

/// Directional steering (two slots, FFN and attention scales of both signs) against the same edit
/// inserted into transformers with hooks. Measured: logits 5.3e-6 of max|logit| (2.4e-6 of it is the torch build), states 2.9e-6; the
/// bounds are the unsteered test's. The steered reference differs from the plain one by far more than
/// the bound (checked), so a steering edit left out or misplaced fails.
#[test]
fn tiny_f32_with_steering_matches_transformers_hooks() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../model/tests/fixtures/hf_tiny_steer");
    let plain = load_f32(&fixture_dir(), "logits.bin");
    let steered = load_f32(&dir, "logits.bin");
    let moved = plain.iter().zip(&steered).fold(0f32, |m, (a, b)| nan_max(m, (a - b).abs()));
    let m = compare_tiny(&dir, false);
    assert!(moved > 1e3 * m.logit_err.max(1e-6 * m.max_logit), "steering moves the reference logits by {moved}: the test would not see it");
    assert_eq!(m.asserted, 640, "every position is compared (no near-tie in this fixture)");
    assert_eq!(m.argmax_ok, m.asserted, "argmax must match at every compared position");
    assert!(m.logit_err <= 1e-5 * m.max_logit, "max |Δlogit| {} exceeds 1e-5 × {}", m.logit_err, m.max_logit);
    for (l, r) in m.state_rel.iter().enumerate() {
        assert!(*r <= 2e-5, "layer {l}: HC state error {r:.3e} of max |state| exceeds 2e-5");
    }
}

/// QAT off: transformers as released (it omits the FP8/FP4 simulation).
/// Measured (this machine, AVX-512 and AVX2 alike): logits 2.4e-6 of max|logit| at worst, states
/// at most ~2e-6 relative. Bounds: 1e-5 / 2e-5 — a wrong RoPE pair, a missing norm weight or an
/// off-by-one window row is orders of magnitude above them.
#[test]
fn tiny_f32_matches_transformers() {
    let m = compare_tiny(&fixture_dir(), false);
    assert_eq!(m.asserted, 640, "every position is compared (no near-tie in this fixture)");
    assert_eq!(m.argmax_ok, m.asserted, "argmax must match at every compared position");
    assert!(m.logit_err <= 1e-5 * m.max_logit, "max |Δlogit| {} exceeds 1e-5 × {}", m.logit_err, m.max_logit);
    for (l, r) in m.state_rel.iter().enumerate() {
        assert!(*r <= 2e-5, "layer {l}: HC state error {r:.3e} of max |state| exceeds 2e-5");
    }
}

/// QAT on (the shipped numerics): the reference inserts the official inference's FP8 KV and FP4 indexer
/// rounding into transformers with hooks (tools/reference/forward_fixtures.py, install_qat).
///
/// Measured: median 6.5e-7 and p99 1.9e-5 of max|logit| per position — as exact as QAT off — but a few
/// positions jump (worst 1.09e-3 at position 545, then 3e-5 at 548, 600, 614): FP8 has 3 mantissa bits and
/// FP4 one, so a value that lands within f32 noise of a rounding boundary rounds to the neighbouring code
/// in one implementation and not in the other, and a KV row rounded differently is seen by later positions.
/// So the test bounds the typical position tightly (median 5e-6, p99 1e-4) and the worst one at 3e-3, and
/// requires the same argmax everywhere.
/// Injected mistakes, each failing this test: FP8 scale not a power of two (median 7.7e-3), FP8 rounding by
/// truncation (median 1.7e-2), raw KV without FP8 (median 5.8e-3), indexer without FP4 (median 1.4e-3).
/// Not detectable here, covered by the formula tests against torch casts (`crates/model/tests/qat_reference.rs`):
/// ties away from zero instead of to even (exact ties do not occur in this data), and one FP8 scale per row
/// instead of per 64-block (this model's nope part is exactly one block).
#[test]
fn tiny_f32_with_qat_matches_the_qat_reference() {
    let dir = fixture_dir().with_file_name("hf_tiny_qat");
    let m = compare_tiny(&dir, true);
    assert_eq!(m.asserted, 640, "every position is compared (no near-tie in this fixture)");
    assert_eq!(m.argmax_ok, m.asserted, "argmax must match at every compared position");
    assert!(m.median_rel <= 5e-6, "median per-position error {:.3e} of max |logit| exceeds 5e-6", m.median_rel);
    assert!(m.p99_rel <= 1e-4, "p99 per-position error {:.3e} of max |logit| exceeds 1e-4", m.p99_rel);
    assert!(m.logit_err <= 3e-3 * m.max_logit, "max |Δlogit| {} exceeds 3e-3 × {}", m.logit_err, m.max_logit);
    for (l, r) in m.state_rel.iter().enumerate() {
        assert!(*r <= 5e-5, "layer {l}: HC state error {r:.3e} of max |state| exceeds 5e-5");
    }
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
                worst = nan_max(worst, got.iter().zip(w).fold(0f32, |a, (x, y)| nan_max(a, (x - y).abs())));
                let am = |x: &[f32]| (0..x.len()).max_by(|&a, &b| x[a].total_cmp(&x[b])).unwrap();
                argmax_ok += (am(got) == am(w)) as usize;
            }
            eprintln!("{mix} {precision:?}: max |Δlogit| {worst:.3e} ({:.3e} of max |logit| {max_abs:.3}); argmax {argmax_ok}/{}", worst / max_abs, lpos.len());
            // Measured on the exact path: 8.1e-7 (q4) and 8.0e-7 (q2) of max |logit| over all 160 positions.
            if precision == Precision::Exact {
                assert_eq!(argmax_ok, lpos.len());
                assert!(worst <= 5e-6 * max_abs, "{mix}: {worst} > 5e-6 × {max_abs}");
            }
        }
    }
}

/// The larger of two error measures, NaN counting as unbounded (`f32::max` would skip it).
fn nan_max(a: f32, b: f32) -> f32 { if a.is_nan() || b.is_nan() { f32::INFINITY } else { a.max(b) } }

/// The routed-expert imatrix (`--imatrix-*`) against the same statistics taken by a hook on
/// transformers' experts (tools/reference/forward_fixtures.py tiny-imatrix): per layer and expert, the
/// mean square of each column of the experts' input and of the down projection's input, collected over
/// the reference tokens in 128-token forward calls. Measured: 4.9e-7 (gate/up) and 4.2e-7 (down) of the largest value; bound 1e-5. Fails with the
/// route weight left out of the down input (checked).
#[test]
fn tiny_f32_imatrix_matches_transformers_hook() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../model/tests/fixtures/hf_tiny_imatrix");
    let refj: Value = serde_json::from_str(&std::fs::read_to_string(fixture_dir().join("reference.json")).unwrap()).unwrap();
    let tokens: Vec<u32> = usizes(&refj["tokens"]).into_iter().map(|t| t as u32).collect();
    let out = std::env::temp_dir().join(format!("ds4-hf-tiny-imatrix-{}.gguf", std::process::id()));
    ds4_convert::convert(&fixture_dir(), &out, ds4_convert::QuantMix::F32).expect("convert");
    let f = Arc::new(GgufFile::open(&out).unwrap());
    let cfg = Config::from_gguf(&f).unwrap();
    let w = Weights::bind(f, &cfg, LayerRange::full(&cfg)).unwrap();
    let mut st = Stage::new(cfg.clone(), w, Options { precision: Precision::Exact, qat: false });
    st.collect_imatrix();
    let mut kv = st.new_kv(tokens.len());
    for c in tokens.chunks(128) {
        st.forward(&mut kv, c, None, Logits::None).unwrap();
    }
    let _ = std::fs::remove_file(&out);
    let im = st.take_imatrix().unwrap();
    assert_eq!(im.routes, (tokens.len() * cfg.n_expert_used * cfg.n_layer) as u64);
    assert_eq!(im.chunks as usize, 5 * cfg.n_layer, "one layer batch per layer and forward call");
    for (file, down, n) in [("gate_up.bin", false, cfg.n_embd), ("down.bin", true, cfg.ff_exp)] {
        let want = load_f32(&dir, file);
        let per = cfg.n_expert * n;
        let got: Vec<f32> = (0..cfg.n_layer).flat_map(|il| im.means(il, down)).collect();
        assert_eq!(got.len(), want.len());
        let scale = want.iter().fold(0f32, |m, v| m.max(v.abs()));
        let err = got.iter().zip(&want).fold(0f32, |m, (a, b)| nan_max(m, (a - b).abs()));
        eprintln!("{file}: max |Δ| {err:.3e} of max {scale:.3} ({:.3e}); {} values per layer", err / scale, per);
        assert!(err <= 1e-5 * scale, "{file}: {err:.3e} over 1e-5 x {scale}");
    }
}
