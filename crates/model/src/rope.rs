//! Rotary position embedding on the interleaved tail of a vector (plain or YaRN-scaled frequencies).
use crate::config::Config;

/// Per-pair frequencies of one layer's rotation.
#[derive(Debug, Clone)]
pub struct Rope {
    freqs: Vec<f64>,
}

impl Rope {
    /// Window-only layers use the plain base; compressed layers use the compress base with YaRN.
    pub fn for_layer(cfg: &Config, ratio: usize) -> Self {
        let dim = cfg.rope_dim;
        let half = dim / 2;
        if ratio == 0 {
            let base = cfg.rope_base as f64;
            let freqs = (0..half).map(|k| base.powf(-2.0 * k as f64 / dim as f64)).collect();
            return Self { freqs };
        }
        let base = cfg.compress_rope_base as f64;
        let orig = cfg.yarn_orig_ctx as f64;
        let two_pi = 2.0 * std::f64::consts::PI;
        let corr = |rot: f64| dim as f64 * (orig / (rot * two_pi)).ln() / (2.0 * base.ln());
        let low = corr(cfg.yarn_beta_fast as f64).floor().max(0.0);
        let mut high = corr(cfg.yarn_beta_slow as f64).ceil().min(dim as f64 - 1.0);
        if high == low {
            high += 0.001;
        }
        let factor = cfg.yarn_factor as f64;
        let freqs = (0..half)
            .map(|k| {
                let theta = base.powf(-2.0 * k as f64 / dim as f64);
                let r = ((k as f64 - low) / (high - low)).clamp(0.0, 1.0);
                theta * (1.0 - r) + theta / factor * r
            })
            .collect();
        Self { freqs }
    }

    /// Per-pair angle frequencies (pair k of the rotated tail turns by `pos · freqs[k]`).
    pub fn freqs(&self) -> &[f64] { &self.freqs }

    /// Rotates the last `2·freqs.len()` elements of `x` (adjacent pairs) by `pos`; `inverse` negates the angle.
    pub fn apply(&self, x: &mut [f32], pos: usize, inverse: bool) {
        let n = x.len();
        let tail = &mut x[n - 2 * self.freqs.len()..];
        let sign = if inverse { -1.0 } else { 1.0 };
        for (k, &f) in self.freqs.iter().enumerate() {
            let ang = pos as f64 * f;
            let (s, c) = ang.sin_cos();
            let (s, c) = ((s * sign) as f32, c as f32);
            let (x0, x1) = (tail[2 * k], tail[2 * k + 1]);
            tail[2 * k] = x0 * c - x1 * s;
            tail[2 * k + 1] = x0 * s + x1 * c;
        }
    }
}
