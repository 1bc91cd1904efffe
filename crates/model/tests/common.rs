#![allow(dead_code)]
use ds4_gguf::GgufFile;
use ds4_model::synth::{self, Mix, SynthSpec};
use ds4_model::{Config, LayerRange, Options, Stage, Weights};
use std::path::PathBuf;
use std::sync::Arc;

/// Writes (once per test binary run) a tiny synthetic model and returns its path.
pub fn tiny_model(mix: Mix, tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("ds4-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(format!("tiny-{tag}.gguf"));
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _g = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    if !path.exists() {
        let spec = SynthSpec { shape: "tiny", mix, seed: 7, layers: None, vocab: None };
        synth::write(&spec, &path, |_, _| {}).unwrap();
    }
    path
}

pub fn load(path: &PathBuf, opts: Options) -> Stage {
    let f = Arc::new(GgufFile::open(path).unwrap());
    let cfg = Config::from_gguf(&f).unwrap();
    let w = Weights::bind(f, &cfg, LayerRange::full(&cfg)).unwrap();
    Stage::new(cfg, w, opts)
}

pub fn tokens(n: usize, vocab: usize, seed: u64) -> Vec<u32> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((s >> 33) % vocab as u64) as u32
        })
        .collect()
}

/// max |a-b| / max |b|; a NaN difference makes it infinite (`f32::max` would skip it).
pub fn rel_err(a: &[f32], b: &[f32]) -> f32 {
    let m = b.iter().fold(0f32, |m, v| m.max(v.abs()));
    a.iter().zip(b).fold(0f32, |e, (x, y)| nan_max(e, (x - y).abs())) / m
}

/// The larger of two error measures, NaN counting as unbounded.
pub fn nan_max(a: f32, b: f32) -> f32 {
    if a.is_nan() || b.is_nan() {
        f32::INFINITY
    } else {
        a.max(b)
    }
}
