//! A Flash-shaped synthetic file (real dimensions, 3 layers: ratios 0, 0 and 4, plus embedding and
//! head) loads through the same code and produces finite logits, prefill and decode.
use ds4_gguf::GgufFile;
use ds4_model::synth::{self, Mix, SynthSpec};
use ds4_model::{Config, LayerRange, Logits, Options, Stage, Weights};
use std::sync::Arc;

#[test]
#[ignore = "writes a ~4.5 GiB model; run with --ignored"]
fn flash_shaped_model_gives_finite_logits() {
    let path = std::env::temp_dir().join(format!("ds4-flash3-{}.gguf", std::process::id()));
    let spec = SynthSpec { shape: "flash:3", mix: Mix::Q2, seed: 3, layers: None, vocab: None };
    synth::write(&spec, &path, |_, _| {}).unwrap();
    let f = Arc::new(GgufFile::open(&path).unwrap());
    let cfg = Config::from_gguf(&f).unwrap();
    assert_eq!((cfg.n_embd, cfg.n_head, cfg.n_expert, cfg.n_vocab), (4096, 64, 256, 129280));
    let w = Weights::bind_mapped(f, &path, &cfg, LayerRange::full(&cfg)).unwrap();
    let mut st = Stage::new(cfg.clone(), w, Options::default());
    let mut kv = st.new_kv(512);
    let toks: Vec<u32> = (0..40u32).map(|i| (i * 7919) % 129280).collect();
    let l = st.forward(&mut kv, &toks[..32], None, Logits::Last).unwrap().to_vec();
    assert_eq!(l.len(), cfg.n_vocab);
    assert!(l.iter().all(|v| v.is_finite()));
    for &t in &toks[32..] {
        let l = st.forward(&mut kv, &[t], None, Logits::Last).unwrap();
        assert!(l.iter().all(|v| v.is_finite()));
    }
    let _ = std::fs::remove_file(&path);
}
