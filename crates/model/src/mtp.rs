//! The multi-token-prediction (MTP) block: a draft model for speculative decoding, loaded from its own
//! GGUF (`mtp.0.*` tensors, as the C engine's `DeepSeek-V4-Flash-MTP-*.gguf`).
//!
//! From a hidden state `H` (the main model's HC streams after its last layer at position i, or the MTP's
//! own output for a recursive draft) and the token t that follows it:
//! `e = e_proj · rmsw(embed(t), enorm)`, `h_s = h_proj · rmsw(H_s, hnorm)` per stream, `X_s = e + h_s`; one
//! window-only block (layer index `n_layer`, its own raw-window cache) turns X into X'; the head collapses
//! X' with the MTP's `hc_head_*`, norms with its `norm` and projects with the main model's `output`: the
//! logits of the token after t.
use crate::config::Config;
use crate::error::{ModelError, Result};
use crate::hc;
use crate::hostload::HostLoad;
use crate::kv::KvState;
use crate::ops::rms_norm;
use crate::stage::{Logits, Options, Stage};
use crate::weights::{Weights, MTP_PREFIX};
use ds4_gguf::GgufFile;
use ds4_quant::matmul;
use std::path::Path;
use std::sync::Arc;

/// The main model's config with the MTP block appended as layer `n_layer`: window-only (ratio 0), not
/// hash-routed, its SwiGLU clamp from the config's extra entry (else the last layer's).
pub fn block_config(main: &Config) -> Config {
    let mut c = main.clone();
    let n = main.n_layer;
    c.compress_ratios.truncate(n);
    c.compress_ratios.push(0);
    let clamp = main.swiglu_clamp.get(n).or(main.swiglu_clamp.last()).copied().unwrap_or(10.0);
    c.swiglu_clamp.truncate(n);
    c.swiglu_clamp.push(clamp);
    c.n_layer = n + 1;
    c
}

/// True when the file holds MTP tensors (`mtp.0.e_proj.weight`).
pub fn is_mtp_file(f: &GgufFile) -> bool {
    f.tensor(&format!("{MTP_PREFIX}e_proj.weight")).is_some()
}

/// Opens and checks an MTP file against the main model (every tensor's name, shape and type), without
/// reading tensor data: the check to run before any weight is loaded.
pub fn check_file(path: &Path, main: &Config) -> Result<Arc<GgufFile>> {
    let f = GgufFile::open(path).map_err(|e| ModelError::Invalid(format!("MTP file {}: {e}", path.display())))?;
    if !is_mtp_file(&f) {
        return Err(ModelError::Invalid(format!(
            "{} is not an MTP file: it has no `{MTP_PREFIX}e_proj.weight` tensor (expected the MTP GGUF, e.g. DeepSeek-V4-Flash-MTP-Q4K-Q8_0-F32.gguf)",
            path.display()
        )));
    }
    if let Ok(n) = f.get_u32("deepseek4.embedding_length") {
        if n as usize != main.n_embd {
            return Err(ModelError::Invalid(format!("MTP file {}: embedding_length {n} does not match the model's {}", path.display(), main.n_embd)));
        }
    }
    let f = Arc::new(f);
    // A dry bind checks the directory only (names, dims, types) and reads no tensor data.
    Weights::mtp_map_plan(&f, &block_config(main)).map_err(|e| ModelError::Invalid(format!("MTP file {} does not match the model: {e}", path.display())))?;
    Ok(f)
}

/// A loaded MTP block, ready to draft.
pub struct Mtp {
    pub stage: Stage,
    x: Vec<f32>,
    rows: Vec<f32>,
    proj: Vec<f32>,
    ep: Vec<f32>,
    flat: Vec<f32>,
    mix: Vec<f32>,
    cur: Vec<f32>,
    logits: Vec<f32>,
    /// Rows of the last `forward` call.
    last_n: usize,
}

impl Mtp {
    /// Checks the file against the main model, then copies its tensors into memory.
    pub fn load(path: &Path, main: &Config, opts: Options) -> Result<Self> {
        let f = check_file(path, main)?;
        let cfg = block_config(main);
        let w = Weights::bind_mtp(f, Some((path, &HostLoad::copy())), &cfg)?;
        Ok(Self::new(Stage::new(cfg, w, opts)))
    }

    /// Checks the file against the main model, then binds its tensors in place in the file's mapping
    /// (nothing copied): for a device drafter, which uploads (or wraps) them itself and runs this
    /// stage only for its configuration and cache shape.
    pub fn load_mapped(path: &Path, main: &Config, opts: Options) -> Result<Self> {
        let f = check_file(path, main)?;
        let cfg = block_config(main);
        let w = Weights::bind_mtp(f, None, &cfg)?;
        Ok(Self::new(Stage::new(cfg, w, opts)))
    }

    fn new(stage: Stage) -> Self {
        Self { stage, x: Vec::new(), rows: Vec::new(), proj: Vec::new(), ep: Vec::new(), flat: Vec::new(), mix: Vec::new(), cur: Vec::new(), logits: Vec::new(), last_n: 0 }
    }

    /// Bytes of the MTP weights held in memory.
    pub fn resident_bytes(&self) -> u64 { self.stage.w.resident_bytes() }

    /// A fresh raw-window cache for the block.
    pub fn new_kv(&self, ctx: usize) -> KvState { self.stage.new_kv(ctx) }

    /// Runs the block over `tokens.len()` pairs at consecutive positions of `kv`: `hidden` holds one HC
    /// row (n_hc × n_embd) per pair, `tokens[i]` the token that follows hidden row i. Returns the logits
    /// of the last pair's next token (n_vocab), or nothing when `logits` is false. `main` must own the
    /// embedding and the output head.
    pub fn forward(&mut self, main: &Stage, kv: &mut KvState, hidden: &[f32], tokens: &[u32], logits: bool) -> Result<&[f32]> {
        let (nh, hd) = (self.stage.cfg.n_hc, self.stage.cfg.hc_dim());
        let n = tokens.len();
        if hidden.len() != n * hd {
            return Err(ModelError::Invalid(format!("MTP input has {} hidden floats for {n} tokens, expected {}", hidden.len(), n * hd)));
        }
        let out_head = main.w.head.as_ref().ok_or_else(|| ModelError::Invalid("MTP drafting needs the model's output head on this stage".into()))?;
        self.inputs(main, hidden, tokens)?;
        let x = std::mem::take(&mut self.x);
        let r = self.stage.forward(kv, tokens, Some(&x), Logits::None).map(|_| ());
        self.x = x;
        r?;
        self.last_n = n;
        if !logits {
            return Ok(&[]);
        }
        // Head on the last row: HC collapse with the MTP's weights, its norm, the main output matrix.
        let Self { stage, flat, mix, cur, logits, .. } = self;
        let (cfg, p) = (&stage.cfg, main.opts.precision);
        let h = stage.w.mtp.as_ref().expect("MTP weights carry the MTP head");
        let y = &stage.hidden(n)[(n - 1) * hd..n * hd];
        flat.resize(hd, 0.0);
        hc::flat_norm(y, flat, cfg.rms_eps);
        mix.resize(nh, 0.0);
        matmul(&stage.w.mat(&h.hc_fn), flat, 1, mix, p);
        cur.resize(cfg.n_embd, 0.0);
        hc::head_collapse(mix, h.hc_scale[0], &h.hc_base, cfg.hc_eps, y, cur);
        rms_norm(cur, Some(&h.norm), cfg.rms_eps);
        logits.resize(main.cfg.n_vocab, 0.0);
        matmul(&main.w.mat(&out_head.output), cur, 1, logits, p);
        Ok(logits)
    }

    /// The block's input streams into `x`: `e = e_proj · rmsw(embed(t), enorm)` per pair plus
    /// `h_s = h_proj · rmsw(H_s, hnorm)` per (pair, stream).
    fn inputs(&mut self, main: &Stage, hidden: &[f32], tokens: &[u32]) -> Result<()> {
        let Self { stage, x, rows, proj, ep, .. } = self;
        let (cfg, p) = (&stage.cfg, main.opts.precision);
        let (e, nh, hd, n) = (cfg.n_embd, cfg.n_hc, cfg.hc_dim(), tokens.len());
        let h = stage.w.mtp.as_ref().expect("MTP weights carry the MTP head");
        rows.resize(n * e, 0.0);
        for (i, &t) in tokens.iter().enumerate() {
            let r = &mut rows[i * e..(i + 1) * e];
            main.w.embed_row(t, r)?;
            rms_norm(r, Some(&h.enorm), cfg.rms_eps);
        }
        ep.resize(n * e, 0.0);
        matmul(&stage.w.mat(&h.e_proj), rows, n, ep, p);
        rows.resize(n * hd, 0.0);
        rows.copy_from_slice(hidden);
        for r in rows.chunks_exact_mut(e) {
            rms_norm(r, Some(&h.hnorm), cfg.rms_eps);
        }
        proj.resize(n * hd, 0.0);
        matmul(&stage.w.mat(&h.h_proj), rows, n * nh, proj, p);
        x.resize(n * hd, 0.0);
        for i in 0..n {
            for s in 0..nh {
                let o = i * hd + s * e;
                for c in 0..e {
                    x[o + c] = ep[i * e + c] + proj[o + c];
                }
            }
        }
        Ok(())
    }

    /// The block's output HC row of the last pair of the last `forward` (the hidden input of a
    /// recursive draft); empty before the first call.
    pub fn last_hidden(&self) -> &[f32] {
        let (hd, n) = (self.stage.cfg.hc_dim(), self.last_n);
        if n == 0 {
            return &[];
        }
        &self.stage.hidden(n)[(n - 1) * hd..n * hd]
    }
}
