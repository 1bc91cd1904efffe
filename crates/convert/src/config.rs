//! config.json of a transformers DeepSeek-V4 checkpoint → the numbers the GGUF needs.
//! Accepts the official style (`compress_ratios`, `num_hash_layers`, `rope_scaling`, `qk_rope_head_dim`)
//! and the style transformers writes back (`layer_types` + `compress_rates`, `mlp_layer_types`,
//! `rope_parameters.compress`, `partial_rotary_factor`). See tools/reference/HF_MAPPING.md §2.
use crate::ConvertError;
use serde_json::{Map, Value};

/// Model shape and hyper-parameters read from config.json.
#[derive(Debug, Clone, PartialEq)]
pub struct HfConfig {
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub n_layers: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub rope_dim: usize,
    pub q_lora_rank: usize,
    pub o_groups: usize,
    pub o_lora_rank: usize,
    pub n_experts: usize,
    pub n_experts_used: usize,
    pub n_shared_experts: usize,
    pub moe_intermediate: usize,
    pub n_hash_layers: usize,
    pub sliding_window: usize,
    pub index_n_heads: usize,
    pub index_head_dim: usize,
    pub index_topk: usize,
    pub hc_mult: usize,
    pub hc_sinkhorn_iters: usize,
    pub hc_eps: f32,
    pub rms_norm_eps: f32,
    pub compress_ratios: Vec<usize>,
    pub swiglu_limit: f32,
    pub rope_theta: f32,
    pub compress_rope_theta: f32,
    pub yarn_factor: f32,
    pub yarn_original_ctx: usize,
    pub yarn_beta_fast: f32,
    pub yarn_beta_slow: f32,
    pub routed_scaling_factor: f32,
    pub norm_topk_prob: bool,
    pub max_position_embeddings: usize,
    pub bos_token_id: u32,
    pub eos_token_id: u32,
}

fn bad(key: &str, problem: impl Into<String>) -> ConvertError {
    ConvertError::Config { key: key.to_string(), problem: problem.into() }
}

struct Obj<'a>(&'a Map<String, Value>);

impl<'a> Obj<'a> {
    fn get(&self, key: &str) -> Option<&'a Value> {
        self.0.get(key).filter(|v| !v.is_null())
    }
    fn usize_opt(&self, key: &str) -> Result<Option<usize>, ConvertError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => match v.as_u64() {
                Some(n) if n <= u32::MAX as u64 => Ok(Some(n as usize)),
                _ => Err(bad(key, format!("expected a non-negative integer < 2^32, found {v}"))),
            },
        }
    }
    fn usize_req(&self, key: &str) -> Result<usize, ConvertError> {
        self.usize_opt(key)?.ok_or_else(|| bad(key, "missing"))
    }
    fn usize_or(&self, key: &str, d: usize) -> Result<usize, ConvertError> {
        Ok(self.usize_opt(key)?.unwrap_or(d))
    }
    fn f32_opt(&self, key: &str) -> Result<Option<f32>, ConvertError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => match v.as_f64() {
                Some(x) if x.is_finite() => Ok(Some(x as f32)),
                _ => Err(bad(key, format!("expected a finite number, found {v}"))),
            },
        }
    }
    fn f32_or(&self, key: &str, d: f32) -> Result<f32, ConvertError> {
        Ok(self.f32_opt(key)?.unwrap_or(d))
    }
    fn bool_or(&self, key: &str, d: bool) -> Result<bool, ConvertError> {
        match self.get(key) {
            None => Ok(d),
            Some(Value::Bool(b)) => Ok(*b),
            Some(v) => Err(bad(key, format!("expected true/false, found {v}"))),
        }
    }
    fn str_opt(&self, key: &str) -> Result<Option<&'a str>, ConvertError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(v) => Err(bad(key, format!("expected a string, found {v}"))),
        }
    }
}

/// First token id of `key`, which may be an int or a list of ints.
fn token_id(o: &Obj, key: &str, d: u32) -> Result<u32, ConvertError> {
    match o.get(key) {
        None => Ok(d),
        Some(Value::Array(a)) => match a.first().and_then(|v| v.as_u64()) {
            Some(n) if n <= u32::MAX as u64 => Ok(n as u32),
            _ => Err(bad(key, "expected an integer or a list of integers")),
        },
        Some(v) => match v.as_u64() {
            Some(n) if n <= u32::MAX as u64 => Ok(n as u32),
            _ => Err(bad(key, format!("expected an integer, found {v}"))),
        },
    }
}

impl HfConfig {
    pub fn from_json_str(s: &str) -> Result<Self, ConvertError> {
        let v: Value = serde_json::from_str(s).map_err(|e| bad("config.json", format!("invalid JSON: {e}")))?;
        let map = v.as_object().ok_or_else(|| bad("config.json", "top level is not a JSON object"))?;
        Self::from_map(map)
    }

    fn from_map(map: &Map<String, Value>) -> Result<Self, ConvertError> {
        let o = Obj(map);
        if let Some(mt) = o.str_opt("model_type")? {
            if mt != "deepseek_v4" {
                return Err(bad("model_type", format!("expected `deepseek_v4`, found `{mt}`")));
            }
        }
        let n_layers = o.usize_req("num_hidden_layers")?;
        let head_dim = o.usize_req("head_dim")?;

        // rope dims: qk_rope_head_dim > partial_rotary_factor·head_dim > HF default 64/512·head_dim
        let rope_dim = match o.usize_opt("qk_rope_head_dim")? {
            Some(r) => r,
            None => {
                let f = o.f32_or("partial_rotary_factor", 64.0 / 512.0)? as f64;
                (head_dim as f64 * f).round() as usize
            }
        };

        // per-layer compress ratios
        let compress_ratios: Vec<usize> = if let Some(v) = o.get("compress_ratios") {
            let a = v.as_array().ok_or_else(|| bad("compress_ratios", "expected an array of integers"))?;
            if a.len() < n_layers {
                return Err(bad("compress_ratios", format!("has {} entries, need at least num_hidden_layers = {n_layers}", a.len())));
            }
            a.iter()
                .take(n_layers)
                .enumerate()
                .map(|(i, x)| x.as_u64().map(|r| r as usize).ok_or_else(|| bad("compress_ratios", format!("entry {i} is not an integer: {x}"))))
                .collect::<Result<_, _>>()?
        } else if let Some(v) = o.get("layer_types") {
            let a = v.as_array().ok_or_else(|| bad("layer_types", "expected an array of strings"))?;
            if a.len() < n_layers {
                return Err(bad("layer_types", format!("has {} entries, need num_hidden_layers = {n_layers}", a.len())));
            }
            let rates = o.get("compress_rates").and_then(|r| r.as_object());
            let rate = |name: &str, d: usize| -> Result<usize, ConvertError> {
                match rates.and_then(|r| r.get(name)) {
                    None => Ok(d),
                    Some(x) => x.as_u64().map(|r| r as usize).ok_or_else(|| bad("compress_rates", format!("`{name}` is not an integer"))),
                }
            };
            let csa = rate("compressed_sparse_attention", 4)?;
            let hca = rate("heavily_compressed_attention", 128)?;
            a.iter()
                .take(n_layers)
                .enumerate()
                .map(|(i, t)| match t.as_str() {
                    Some("sliding_attention") => Ok(0),
                    Some("compressed_sparse_attention") => Ok(csa),
                    Some("heavily_compressed_attention") => Ok(hca),
                    _ => Err(bad("layer_types", format!("entry {i} is not a DeepSeek-V4 layer type: {t}"))),
                })
                .collect::<Result<_, _>>()?
        } else {
            return Err(bad("compress_ratios", "missing (and no `layer_types` either); the layer map must be explicit"));
        };
        for (i, &r) in compress_ratios.iter().enumerate() {
            if r != 0 && r != 4 && r != 128 {
                return Err(bad("compress_ratios", format!("layer {i}: ratio {r}, expected 0, 4 or 128")));
            }
        }

        // hash-routed layers: a prefix
        let n_hash_layers = if let Some(n) = o.usize_opt("num_hash_layers")? {
            n
        } else if let Some(v) = o.get("mlp_layer_types") {
            let a = v.as_array().ok_or_else(|| bad("mlp_layer_types", "expected an array of strings"))?;
            let n = a.iter().take_while(|t| t.as_str() == Some("hash_moe")).count();
            if let Some((i, t)) = a.iter().enumerate().skip(n).find(|(_, t)| t.as_str() != Some("moe")) {
                return Err(bad("mlp_layer_types", format!("entry {i} is {t}: hash_moe layers must be a prefix, the rest moe")));
            }
            n
        } else {
            3
        };
        if n_hash_layers > n_layers {
            return Err(bad("num_hash_layers", format!("{n_hash_layers} > num_hidden_layers {n_layers}")));
        }

        // YaRN parameters of the compressed layers
        let rope_scaling = match (o.get("rope_scaling"), o.get("rope_parameters")) {
            (Some(Value::Object(m)), _) => Some(("rope_scaling", m)),
            (_, Some(Value::Object(m))) => match m.get("compress") {
                Some(Value::Object(c)) => Some(("rope_parameters.compress", c)),
                _ => Some(("rope_parameters", m)),
            },
            _ => None,
        };
        let (rs_key, rs) = rope_scaling.ok_or_else(|| bad("rope_scaling", "missing; DeepSeek-V4 needs the YaRN parameters explicitly"))?;
        let rs = Obj(rs);
        let ty = rs.str_opt("type")?.or(rs.str_opt("rope_type")?).unwrap_or("default");
        if ty != "yarn" {
            return Err(bad(&format!("{rs_key}.type"), format!("expected `yarn`, found `{ty}`")));
        }
        let yarn_factor = rs.f32_opt("factor")?.ok_or_else(|| bad(&format!("{rs_key}.factor"), "missing"))?;
        let yarn_original_ctx = rs
            .usize_opt("original_max_position_embeddings")?
            .ok_or_else(|| bad(&format!("{rs_key}.original_max_position_embeddings"), "missing"))?;
        let yarn_beta_fast = rs.f32_or("beta_fast", 32.0)?;
        let yarn_beta_slow = rs.f32_or("beta_slow", 1.0)?;
        let compress_rope_theta = match o.f32_opt("compress_rope_theta")? {
            Some(t) => t,
            None => rs.f32_or("rope_theta", 160000.0)?,
        };

        let scoring = o.str_opt("scoring_func")?.unwrap_or("sqrtsoftplus");
        if scoring != "sqrtsoftplus" {
            return Err(bad("scoring_func", format!("expected `sqrtsoftplus`, found `{scoring}`")));
        }
        let act = o.str_opt("hidden_act")?.unwrap_or("silu");
        if act != "silu" {
            return Err(bad("hidden_act", format!("expected `silu`, found `{act}`")));
        }
        if o.bool_or("tie_word_embeddings", false)? {
            return Err(bad("tie_word_embeddings", "expected false (DeepSeek-V4 has a separate output head)"));
        }

        let cfg = HfConfig {
            vocab_size: o.usize_req("vocab_size")?,
            hidden_size: o.usize_req("hidden_size")?,
            n_layers,
            n_heads: o.usize_req("num_attention_heads")?,
            n_kv_heads: o.usize_or("num_key_value_heads", 1)?,
            head_dim,
            rope_dim,
            q_lora_rank: o.usize_req("q_lora_rank")?,
            o_groups: o.usize_req("o_groups")?,
            o_lora_rank: o.usize_req("o_lora_rank")?,
            n_experts: o.usize_req("n_routed_experts")?,
            n_experts_used: o.usize_req("num_experts_per_tok")?,
            n_shared_experts: o.usize_or("n_shared_experts", 1)?,
            moe_intermediate: o.usize_req("moe_intermediate_size")?,
            n_hash_layers,
            sliding_window: o.usize_req("sliding_window")?,
            index_n_heads: o.usize_req("index_n_heads")?,
            index_head_dim: o.usize_req("index_head_dim")?,
            index_topk: o.usize_req("index_topk")?,
            hc_mult: o.usize_or("hc_mult", 4)?,
            hc_sinkhorn_iters: o.usize_or("hc_sinkhorn_iters", 20)?,
            hc_eps: o.f32_or("hc_eps", 1e-6)?,
            rms_norm_eps: o.f32_or("rms_norm_eps", 1e-6)?,
            compress_ratios,
            swiglu_limit: o.f32_or("swiglu_limit", 10.0)?,
            rope_theta: o.f32_or("rope_theta", 10000.0)?,
            compress_rope_theta,
            yarn_factor,
            yarn_original_ctx,
            yarn_beta_fast,
            yarn_beta_slow,
            routed_scaling_factor: o.f32_or("routed_scaling_factor", 1.5)?,
            norm_topk_prob: o.bool_or("norm_topk_prob", true)?,
            max_position_embeddings: o.usize_or("max_position_embeddings", 1048576)?,
            bos_token_id: token_id(&o, "bos_token_id", 0)?,
            eos_token_id: token_id(&o, "eos_token_id", 1)?,
        };
        cfg.validate()?;
        Ok(cfg)
    }

    fn validate(&self) -> Result<(), ConvertError> {
        let pos = |k: &str, v: usize| if v == 0 { Err(bad(k, "must be > 0")) } else { Ok(()) };
        pos("vocab_size", self.vocab_size)?;
        pos("hidden_size", self.hidden_size)?;
        pos("num_hidden_layers", self.n_layers)?;
        pos("num_attention_heads", self.n_heads)?;
        pos("head_dim", self.head_dim)?;
        pos("q_lora_rank", self.q_lora_rank)?;
        pos("o_groups", self.o_groups)?;
        pos("o_lora_rank", self.o_lora_rank)?;
        pos("n_routed_experts", self.n_experts)?;
        pos("num_experts_per_tok", self.n_experts_used)?;
        pos("moe_intermediate_size", self.moe_intermediate)?;
        pos("sliding_window", self.sliding_window)?;
        pos("index_n_heads", self.index_n_heads)?;
        pos("index_head_dim", self.index_head_dim)?;
        pos("index_topk", self.index_topk)?;
        pos("hc_mult", self.hc_mult)?;
        pos("hc_sinkhorn_iters", self.hc_sinkhorn_iters)?;
        if self.n_kv_heads != 1 {
            return Err(bad("num_key_value_heads", format!("expected 1 (shared K=V), found {}", self.n_kv_heads)));
        }
        if self.n_shared_experts != 1 {
            return Err(bad("n_shared_experts", format!("expected 1, found {}", self.n_shared_experts)));
        }
        if self.rope_dim == 0 || self.rope_dim % 2 != 0 || self.rope_dim >= self.head_dim {
            return Err(bad("qk_rope_head_dim", format!("{} must be even, > 0 and < head_dim {}", self.rope_dim, self.head_dim)));
        }
        if self.rope_dim > self.index_head_dim {
            return Err(bad("index_head_dim", format!("{} is smaller than the rope dims {}", self.index_head_dim, self.rope_dim)));
        }
        if self.n_heads % self.o_groups != 0 {
            return Err(bad("o_groups", format!("{} does not divide num_attention_heads {}", self.o_groups, self.n_heads)));
        }
        if self.n_experts_used > self.n_experts {
            return Err(bad("num_experts_per_tok", format!("{} > n_routed_experts {}", self.n_experts_used, self.n_experts)));
        }
        if self.yarn_factor < 1.0 {
            return Err(bad("rope_scaling.factor", format!("expected >= 1, found {}", self.yarn_factor)));
        }
        // the whole model must stay addressable: guard products used for shapes
        let big = [
            self.vocab_size.checked_mul(self.hidden_size),
            (self.n_heads).checked_mul(self.head_dim).and_then(|x| x.checked_mul(self.q_lora_rank)),
            self.n_experts.checked_mul(self.moe_intermediate).and_then(|x| x.checked_mul(self.hidden_size)),
            (self.hc_mult).checked_mul(self.hidden_size).and_then(|x| x.checked_mul((2 + self.hc_mult) * self.hc_mult)),
        ];
        if big.iter().any(|x| x.map_or(true, |v| v > (1usize << 40))) {
            return Err(bad("config.json", "tensor sizes overflow (shape values too large)"));
        }
        Ok(())
    }
}
