//! transformers DeepSeek-V4 checkpoint (config.json + *.safetensors, in-memory parameter names) →
//! ds4-layout GGUF. The name/shape/layout mapping is documented in `tools/reference/HF_MAPPING.md`.
//!
//! ```no_run
//! use ds4_convert::{convert, QuantMix};
//! let s = convert(std::path::Path::new("ckpt"), std::path::Path::new("out.gguf"), QuantMix::F32).unwrap();
//! println!("{} tensors", s.tensors.len());
//! ```
mod config;
mod plan;
mod source;
mod tokenizer;

pub use config::HfConfig;
pub use plan::{plan, TensorPlan};

use ds4_gguf::{GgmlType, GgufError, GgufWriter};
use std::path::{Path, PathBuf};
use thiserror::Error;

/// Which GGUF types the converted tensors get.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QuantMix {
    /// Every float tensor F32 (exact comparison with the reference).
    F32,
    /// ds4's F16 tensors F16; its Q8_0 tensors as F16; routed experts F16.
    F16,
    /// ds4 layout types; routed experts Q8_0.
    Q8,
    /// ds4 layout types; routed experts Q4_K.
    Q4,
    /// ds4 layout types; routed gate/up IQ2_XXS, down Q2_K.
    Q2,
}

impl QuantMix {
    pub fn name(self) -> &'static str {
        match self {
            Self::F32 => "f32",
            Self::F16 => "f16",
            Self::Q8 => "q8",
            Self::Q4 => "q4",
            Self::Q2 => "q2",
        }
    }
}

impl std::str::FromStr for QuantMix {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "f32" => Ok(Self::F32),
            "f16" => Ok(Self::F16),
            "q8" => Ok(Self::Q8),
            "q4" => Ok(Self::Q4),
            "q2" => Ok(Self::Q2),
            o => Err(format!("unknown mix `{o}` (expected f32, f16, q8, q4 or q2)")),
        }
    }
}

impl std::fmt::Display for QuantMix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[derive(Debug, Error)]
pub enum ConvertError {
    #[error("i/o error on {path}: {source}")]
    Io { path: PathBuf, #[source] source: std::io::Error },
    #[error("config.json: `{key}`: {problem}")]
    Config { key: String, problem: String },
    #[error("{path}: not a valid safetensors file: {problem}")]
    Safetensors { path: PathBuf, problem: String },
    #[error("no *.safetensors file in {0}")]
    NoSafetensors(PathBuf),
    #[error("tensor `{name}` is in more than one safetensors file")]
    DuplicateTensor { name: String },
    #[error("checkpoint tensor `{name}` is missing (needed for GGUF `{gguf}`)")]
    MissingTensor { name: String, gguf: String },
    #[error("checkpoint tensor `{name}`: shape {got:?}, expected {expected:?} (from config.json)")]
    Shape { name: String, expected: Vec<usize>, got: Vec<usize> },
    #[error("checkpoint tensor `{name}`: dtype {dtype} not supported here (expected {expected})")]
    Dtype { name: String, dtype: String, expected: &'static str },
    #[error("checkpoint tensor `{name}`: value {value} at element {index} out of range ({problem})")]
    Value { name: String, index: usize, value: String, problem: String },
    #[error("GGUF tensor `{name}` as {ty}: row length {row} is not a multiple of the {ty} block size {block}; choose another mix")]
    Block { name: String, ty: &'static str, row: u64, block: usize },
    #[error("quantizing `{name}` to {ty}: {problem}")]
    Quant { name: String, ty: &'static str, problem: String },
    #[error("tokenizer.json: {0}")]
    Tokenizer(String),
    #[error(transparent)]
    Gguf(#[from] GgufError),
}

/// What `convert` produced.
#[derive(Debug, Clone)]
pub struct Summary {
    pub config: HfConfig,
    pub mix: QuantMix,
    /// GGUF tensors in file order: name, type, GGUF dims.
    pub tensors: Vec<(String, GgmlType, Vec<u64>)>,
    /// Bytes of tensor data written (without header and padding).
    pub tensor_bytes: u64,
    /// Checkpoint tensors that were not used (e.g. MTP weights), sorted.
    pub unused: Vec<String>,
    /// Whether tokenizer.json was found and embedded (otherwise placeholder tokens).
    pub tokenizer_embedded: bool,
}

/// Reads `checkpoint_dir/config.json` and every `checkpoint_dir/*.safetensors`, writes the GGUF at `out`.
pub fn convert(checkpoint_dir: &Path, out: &Path, mix: QuantMix) -> Result<Summary, ConvertError> {
    let cfg_path = checkpoint_dir.join("config.json");
    let text = std::fs::read_to_string(&cfg_path).map_err(|e| ConvertError::Io { path: cfg_path.clone(), source: e })?;
    let cfg = HfConfig::from_json_str(&text)?;
    let src = source::Source::open(checkpoint_dir)?;
    let plans = plan(&cfg, mix);

    // Check everything before writing anything: presence, shape, dtype, block sizes.
    for p in &plans {
        for s in &p.sources {
            src.check(&s.name, &s.shape, &p.name, p.int)?;
        }
        let block = p.ty.block_elems();
        if p.dims[0] % block as u64 != 0 {
            return Err(ConvertError::Block { name: p.name.clone(), ty: p.ty.name(), row: p.dims[0], block });
        }
    }
    let tok = tokenizer::load(checkpoint_dir, &cfg)?;

    let mut w = GgufWriter::new();
    let name = checkpoint_dir
        .canonicalize()
        .ok()
        .and_then(|p| p.file_name().map(|s| s.to_string_lossy().into_owned()))
        .unwrap_or_else(|| "deepseek-v4".into());
    write_metadata(&mut w, &cfg, &name);
    tokenizer::write(&mut w, &tok);
    for p in &plans {
        w.add_tensor_info(&p.name, p.ty, &p.dims)?;
    }
    let mut stream = w.begin(out)?;
    let mut tensor_bytes = 0u64;
    for p in &plans {
        let bytes = plan::produce(p, &src)?;
        tensor_bytes += bytes.len() as u64;
        stream.write(&bytes)?;
    }
    stream.finish()?;

    let used: std::collections::HashSet<&str> = plans.iter().flat_map(|p| p.sources.iter().map(|s| s.name.as_str())).collect();
    let unused = src.names().into_iter().filter(|n| !used.contains(n.as_str())).collect();
    Ok(Summary {
        config: cfg,
        mix,
        tensors: plans.iter().map(|p| (p.name.clone(), p.ty, p.dims.clone())).collect(),
        tensor_bytes,
        unused,
        tokenizer_embedded: tok.from_file,
    })
}

/// The `deepseek4.*` metadata (spec §4.2, including the keys llama.cpp requires), written by the same
/// code the engine's synthetic models use, from the checkpoint's config.
pub fn write_metadata(w: &mut GgufWriter, c: &HfConfig, name: &str) {
    model_config(c).write_gguf(w, name, c.max_position_embeddings);
}

/// The engine's view of a checkpoint config.
pub fn model_config(c: &HfConfig) -> ds4_model::Config {
    ds4_model::Config {
        n_layer: c.n_layers,
        n_embd: c.hidden_size,
        n_vocab: c.vocab_size,
        n_head: c.n_heads,
        head_dim: c.head_dim,
        rope_dim: c.rope_dim,
        q_lora: c.q_lora_rank,
        o_lora: c.o_lora_rank,
        o_groups: c.o_groups,
        n_expert: c.n_experts,
        n_expert_used: c.n_experts_used,
        ff_exp: c.moe_intermediate,
        n_shared: c.n_shared_experts,
        n_hash_layer: c.n_hash_layers,
        swa: c.sliding_window,
        idx_heads: c.index_n_heads,
        idx_dim: c.index_head_dim,
        idx_topk: c.index_topk,
        n_hc: c.hc_mult,
        sinkhorn_iters: c.hc_sinkhorn_iters,
        compress_ratios: c.compress_ratios.clone(),
        swiglu_clamp: vec![c.swiglu_limit; c.n_layers],
        rope_base: c.rope_theta,
        compress_rope_base: c.compress_rope_theta,
        yarn_factor: c.yarn_factor,
        yarn_orig_ctx: c.yarn_original_ctx,
        yarn_beta_fast: c.yarn_beta_fast,
        yarn_beta_slow: c.yarn_beta_slow,
        expert_weights_scale: c.routed_scaling_factor,
        expert_weights_norm: c.norm_topk_prob,
        rms_eps: c.rms_norm_eps,
        hc_eps: c.hc_eps,
    }
}
