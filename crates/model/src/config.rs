//! Model hyper-parameters read from GGUF metadata (the C engine's `deepseek4.*` keys).
use crate::error::{cfg_err, Result};
use ds4_gguf::{GgufFile, GgufWriter, MetaType, MetaValue};

pub const ARCH: &str = "deepseek4";

/// Everything the forward pass needs to know about the shape of the model.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    pub n_layer: usize,
    pub n_embd: usize,
    pub n_vocab: usize,
    pub n_head: usize,
    pub head_dim: usize,
    pub rope_dim: usize,
    pub q_lora: usize,
    pub o_lora: usize,
    pub o_groups: usize,
    pub n_expert: usize,
    pub n_expert_used: usize,
    pub ff_exp: usize,
    pub n_shared: usize,
    pub n_hash_layer: usize,
    pub swa: usize,
    pub idx_heads: usize,
    pub idx_dim: usize,
    pub idx_topk: usize,
    pub n_hc: usize,
    pub sinkhorn_iters: usize,
    pub compress_ratios: Vec<usize>,
    pub swiglu_clamp: Vec<f32>,
    pub rope_base: f32,
    pub compress_rope_base: f32,
    pub yarn_factor: f32,
    pub yarn_orig_ctx: usize,
    pub yarn_beta_fast: f32,
    pub yarn_beta_slow: f32,
    pub expert_weights_scale: f32,
    pub expert_weights_norm: bool,
    pub rms_eps: f32,
    pub hc_eps: f32,
}

fn key(k: &str) -> String {
    format!("{ARCH}.{k}")
}

impl Config {
    pub fn from_gguf(f: &GgufFile) -> Result<Self> {
        let u = |k: &str| -> Result<usize> { Ok(f.get_u32(&key(k))? as usize) };
        let fl = |k: &str| -> Result<f32> { Ok(f.get_f32(&key(k))?) };
        if let Ok(arch) = f.get_str("general.architecture") {
            if arch != ARCH {
                return Err(cfg_err("general.architecture", format!("expected `{ARCH}`, found `{arch}`")));
            }
        }
        let n_layer = u("block_count")?;
        let n_vocab = match f.get(&key("vocab_size")) {
            Some(_) => u("vocab_size")?,
            None => match f.tensor("token_embd.weight").or_else(|| f.tensor("output.weight")) {
                Some(t) if t.dims.len() == 2 => t.dims[1] as usize,
                _ => return Err(cfg_err(&key("vocab_size"), "missing, and no token_embd/output tensor to infer it from")),
            },
        };
        let ratios = f.get_u32_array(&key("attention.compress_ratios"))?;
        let clamps = f.get_f32_array(&key("swiglu_clamp_exp"))?;
        let cfg = Config {
            n_layer,
            n_embd: u("embedding_length")?,
            n_vocab,
            n_head: u("attention.head_count")?,
            head_dim: u("attention.key_length")?,
            rope_dim: u("rope.dimension_count")?,
            q_lora: u("attention.q_lora_rank")?,
            o_lora: u("attention.output_lora_rank")?,
            o_groups: u("attention.output_group_count")?,
            n_expert: u("expert_count")?,
            n_expert_used: u("expert_used_count")?,
            ff_exp: u("expert_feed_forward_length")?,
            n_shared: u("expert_shared_count")?,
            n_hash_layer: u("hash_layer_count")?,
            swa: u("attention.sliding_window")?,
            idx_heads: u("attention.indexer.head_count")?,
            idx_dim: u("attention.indexer.key_length")?,
            idx_topk: u("attention.indexer.top_k")?,
            n_hc: u("hyper_connection.count")?,
            sinkhorn_iters: u("hyper_connection.sinkhorn_iterations")?,
            compress_ratios: ratios.iter().map(|&r| r as usize).collect(),
            swiglu_clamp: clamps,
            rope_base: fl("rope.freq_base")?,
            compress_rope_base: fl("attention.compress_rope_freq_base")?,
            yarn_factor: fl("rope.scaling.factor")?,
            yarn_orig_ctx: f.get_u64(&key("rope.scaling.original_context_length"))? as usize,
            yarn_beta_fast: fl("rope.scaling.yarn_beta_fast")?,
            yarn_beta_slow: fl("rope.scaling.yarn_beta_slow")?,
            expert_weights_scale: fl("expert_weights_scale")?,
            expert_weights_norm: f.get_bool(&key("expert_weights_norm")).unwrap_or(true),
            rms_eps: fl("attention.layer_norm_rms_epsilon")?,
            hc_eps: fl("hyper_connection.epsilon")?,
        };
        for k in ["expert_group_count", "expert_group_used_count"] {
            if f.get(&key(k)).is_some() && u(k)? != 0 {
                return Err(cfg_err(&key(k), "group-limited routing is not part of DeepSeek V4; expected 0"));
            }
        }
        if let Some(v) = f.get(&key("attention.head_count_kv")) {
            if !matches!(v, MetaValue::U32(1) | MetaValue::I32(1) | MetaValue::U64(1)) {
                return Err(cfg_err(&key("attention.head_count_kv"), "expected 1 (shared K=V)"));
            }
        }
        if let Some(v) = f.get(&key("attention.value_length")) {
            let _ = v;
            if u("attention.value_length")? != cfg.head_dim {
                return Err(cfg_err(&key("attention.value_length"), format!("expected {} (= key_length)", cfg.head_dim)));
            }
        }
        cfg.validate()?;
        Ok(cfg)
    }

    /// Consistency checks that the forward pass relies on; each error names the key and the expectation.
    pub fn validate(&self) -> Result<()> {
        let chk = |ok: bool, k: &str, what: String| if ok { Ok(()) } else { Err(cfg_err(&key(k), what)) };
        chk(self.n_layer > 0 && self.n_layer <= 1024, "block_count", format!("expected 1..=1024, got {}", self.n_layer))?;
        chk(self.n_embd > 0 && self.n_embd <= 65536, "embedding_length", format!("expected 1..=65536, got {}", self.n_embd))?;
        chk(self.n_vocab > 0 && self.n_vocab <= 1 << 24, "vocab_size", format!("expected 1..=2^24, got {}", self.n_vocab))?;
        chk(self.n_head > 0 && self.n_head <= 1024, "attention.head_count", format!("expected 1..=1024, got {}", self.n_head))?;
        chk(self.rope_dim % 2 == 0 && self.rope_dim > 0, "rope.dimension_count", format!("expected a positive even number, got {}", self.rope_dim))?;
        chk(self.head_dim > self.rope_dim && self.head_dim <= 4096, "attention.key_length", format!("expected > rope dims ({}) and <= 4096, got {}", self.rope_dim, self.head_dim))?;
        chk(self.idx_dim > self.rope_dim && self.idx_dim.is_power_of_two(), "attention.indexer.key_length", format!("expected a power of two > rope dims ({}), got {}", self.rope_dim, self.idx_dim))?;
        chk(self.idx_heads > 0, "attention.indexer.head_count", "expected > 0".into())?;
        chk(self.idx_topk > 0, "attention.indexer.top_k", "expected > 0".into())?;
        chk(self.o_groups > 0 && self.n_head % self.o_groups == 0, "attention.output_group_count", format!("expected a divisor of head_count {}, got {}", self.n_head, self.o_groups))?;
        chk(self.o_lora > 0, "attention.output_lora_rank", "expected > 0".into())?;
        chk(self.q_lora > 0, "attention.q_lora_rank", "expected > 0".into())?;
        chk(self.n_expert > 0 && self.n_expert <= 4096, "expert_count", format!("expected 1..=4096, got {}", self.n_expert))?;
        chk(self.n_expert_used > 0 && self.n_expert_used <= self.n_expert, "expert_used_count", format!("expected 1..={}, got {}", self.n_expert, self.n_expert_used))?;
        chk(self.ff_exp > 0, "expert_feed_forward_length", "expected > 0".into())?;
        chk(self.n_shared <= 1, "expert_shared_count", format!("expected 0 or 1, got {}", self.n_shared))?;
        chk(self.n_hash_layer <= self.n_layer, "hash_layer_count", format!("expected <= block_count {}", self.n_layer))?;
        chk(self.swa > 0 && self.swa <= 1 << 20, "attention.sliding_window", format!("expected 1..=2^20, got {}", self.swa))?;
        chk(self.n_hc > 0 && self.n_hc <= 16, "hyper_connection.count", format!("expected 1..=16, got {}", self.n_hc))?;
        chk(self.sinkhorn_iters > 0 && self.sinkhorn_iters <= 1000, "hyper_connection.sinkhorn_iterations", format!("expected 1..=1000, got {}", self.sinkhorn_iters))?;
        chk(self.compress_ratios.len() >= self.n_layer, "attention.compress_ratios", format!("expected >= {} entries, got {}", self.n_layer, self.compress_ratios.len()))?;
        for (il, &r) in self.compress_ratios.iter().take(self.n_layer).enumerate() {
            chk(r == 0 || r == 4 || r == 128 || (r >= 2 && r <= 4096 && r.is_power_of_two()), "attention.compress_ratios", format!("layer {il}: expected 0, 4 or 128, got {r}"))?;
        }
        chk(self.swiglu_clamp.len() >= self.n_layer, "swiglu_clamp_exp", format!("expected >= {} entries, got {}", self.n_layer, self.swiglu_clamp.len()))?;
        chk(self.rope_base > 0.0 && self.compress_rope_base > 0.0, "rope.freq_base", "expected > 0".into())?;
        chk(self.yarn_factor >= 1.0, "rope.scaling.factor", format!("expected >= 1, got {}", self.yarn_factor))?;
        chk(self.yarn_orig_ctx > 0, "rope.scaling.original_context_length", "expected > 0".into())?;
        chk(self.rms_eps > 0.0 && self.rms_eps < 1.0, "attention.layer_norm_rms_epsilon", format!("expected in (0,1), got {}", self.rms_eps))?;
        chk(self.hc_eps >= 0.0 && self.hc_eps < 1.0, "hyper_connection.epsilon", format!("expected in [0,1), got {}", self.hc_eps))?;
        Ok(())
    }

    /// Writes the metadata keys `from_gguf` reads (plus the ones llama.cpp's loader needs), so that
    /// synthetic and converted files carry the same keys.
    pub fn write_gguf(&self, w: &mut GgufWriter, name: &str, context_length: usize) {
        let u = |v: usize| MetaValue::U32(v as u32);
        w.add_kv("general.architecture", MetaValue::Str(ARCH.into()));
        w.add_kv("general.name", MetaValue::Str(name.into()));
        let ints: &[(&str, usize)] = &[
            ("block_count", self.n_layer),
            ("context_length", context_length),
            ("embedding_length", self.n_embd),
            ("vocab_size", self.n_vocab),
            ("attention.head_count", self.n_head),
            ("attention.head_count_kv", 1),
            ("attention.key_length", self.head_dim),
            ("attention.value_length", self.head_dim),
            ("rope.dimension_count", self.rope_dim),
            ("attention.q_lora_rank", self.q_lora),
            ("attention.output_lora_rank", self.o_lora),
            ("attention.output_group_count", self.o_groups),
            ("expert_count", self.n_expert),
            ("expert_used_count", self.n_expert_used),
            ("expert_feed_forward_length", self.ff_exp),
            ("expert_shared_count", self.n_shared),
            ("expert_group_count", 0),
            ("expert_group_used_count", 0),
            ("hash_layer_count", self.n_hash_layer),
            ("attention.sliding_window", self.swa),
            ("attention.indexer.head_count", self.idx_heads),
            ("attention.indexer.key_length", self.idx_dim),
            ("attention.indexer.top_k", self.idx_topk),
            ("hyper_connection.count", self.n_hc),
            ("hyper_connection.sinkhorn_iterations", self.sinkhorn_iters),
            ("rope.scaling.original_context_length", self.yarn_orig_ctx),
            ("expert_gating_func", 4),
        ];
        for (k, v) in ints {
            w.add_kv(&key(k), u(*v));
        }
        let floats: &[(&str, f32)] = &[
            ("rope.freq_base", self.rope_base),
            ("attention.compress_rope_freq_base", self.compress_rope_base),
            ("rope.scaling.factor", self.yarn_factor),
            ("rope.scaling.yarn_beta_fast", self.yarn_beta_fast),
            ("rope.scaling.yarn_beta_slow", self.yarn_beta_slow),
            ("expert_weights_scale", self.expert_weights_scale),
            ("attention.layer_norm_rms_epsilon", self.rms_eps),
            ("hyper_connection.epsilon", self.hc_eps),
        ];
        for (k, v) in floats {
            w.add_kv(&key(k), MetaValue::F32(*v));
        }
        w.add_kv(&key("expert_weights_norm"), MetaValue::Bool(self.expert_weights_norm));
        w.add_kv(&key("rope.scaling.type"), MetaValue::Str("yarn".into()));
        let ratios = self.compress_ratios.iter().map(|&r| MetaValue::U32(r as u32)).collect();
        w.add_kv(&key("attention.compress_ratios"), MetaValue::Array(MetaType::U32, ratios));
        let clamps = self.swiglu_clamp.iter().map(|&c| MetaValue::F32(c)).collect();
        w.add_kv(&key("swiglu_clamp_exp"), MetaValue::Array(MetaType::F32, clamps));
    }

    pub fn ratio(&self, il: usize) -> usize { self.compress_ratios[il] }
    pub fn q_dim(&self) -> usize { self.n_head * self.head_dim }
    pub fn nope_dim(&self) -> usize { self.head_dim - self.rope_dim }
    pub fn hc_dim(&self) -> usize { self.n_hc * self.n_embd }
    pub fn hc_mix(&self) -> usize { (2 + self.n_hc) * self.n_hc }
    pub fn heads_per_group(&self) -> usize { self.n_head / self.o_groups }
    pub fn is_hash_layer(&self, il: usize) -> bool { il < self.n_hash_layer }
    /// Width factor of the compressor projections: overlapping (ratio 4) windows carry two lanes.
    pub fn compress_coff(&self, il: usize) -> usize { if self.ratio(il) == 4 { 2 } else { 1 } }
}
