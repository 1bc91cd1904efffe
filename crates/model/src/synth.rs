//! Deterministic synthetic models in the exact ds4 GGUF layout (random weights, real shapes).
use crate::config::Config;
use crate::error::{ModelError, Result};
use ds4_gguf::{GgmlType, GgufWriter, MetaType, MetaValue};
use half::f16;
use std::path::Path;

/// Named shapes; `flash:N` / `pro:N` keep the real dimensions with only the first N layers.
pub fn shape(name: &str) -> Result<Config> {
    if let Some((base, n)) = name.split_once(':') {
        let n: usize = n.parse().map_err(|_| ModelError::Invalid(format!("shape `{name}`: `{n}` is not a layer count")))?;
        let mut c = shape(base)?;
        if base == "tiny" || n == 0 || n > c.n_layer {
            return Err(ModelError::Invalid(format!("shape `{name}`: expected flash:N or pro:N with 1 <= N <= {}", c.n_layer)));
        }
        c.n_layer = n;
        c.compress_ratios.truncate(n);
        c.swiglu_clamp.truncate(n);
        c.n_hash_layer = c.n_hash_layer.min(n);
        return Ok(c);
    }
    let base = |n_layer: usize, ratios: Vec<usize>| Config {
        n_layer,
        n_embd: 4096,
        n_vocab: 129280,
        n_head: 64,
        head_dim: 512,
        rope_dim: 64,
        q_lora: 1024,
        o_lora: 1024,
        o_groups: 8,
        n_expert: 256,
        n_expert_used: 6,
        ff_exp: 2048,
        n_shared: 1,
        n_hash_layer: 3,
        swa: 128,
        idx_heads: 64,
        idx_dim: 128,
        idx_topk: 512,
        n_hc: 4,
        sinkhorn_iters: 20,
        compress_ratios: ratios,
        swiglu_clamp: vec![10.0; n_layer + 1],
        rope_base: 10000.0,
        compress_rope_base: 160000.0,
        yarn_factor: 16.0,
        yarn_orig_ctx: 65536,
        yarn_beta_fast: 32.0,
        yarn_beta_slow: 1.0,
        expert_weights_scale: 1.5,
        expert_weights_norm: true,
        rms_eps: 1e-6,
        hc_eps: 1e-6,
    };
    let alt = |n: usize, first: usize| -> Vec<usize> {
        let mut r: Vec<usize> = (0..n).map(|il| if il < 2 { first } else if il % 2 == 0 { 4 } else { 128 }).collect();
        r.push(0); // MTP block
        r
    };
    Ok(match name {
        "flash" => base(43, alt(43, 0)),
        "pro" => Config {
            n_embd: 7168,
            n_head: 128,
            q_lora: 1536,
            o_groups: 16,
            n_expert: 384,
            ff_exp: 3072,
            idx_topk: 1024,
            expert_weights_scale: 2.5,
            ..base(61, alt(61, 128))
        },
        "tiny" => Config {
            n_embd: 256,
            n_vocab: 0, // set from the vocabulary
            n_head: 4,
            head_dim: 128,
            q_lora: 64,
            o_lora: 64,
            o_groups: 2,
            n_expert: 8,
            n_expert_used: 2,
            ff_exp: 256,
            swa: 32,
            idx_heads: 16,
            idx_topk: 8,
            ..base(6, vec![0, 0, 4, 128, 4, 128, 0])
        },
        other => return Err(ModelError::Invalid(format!("unknown shape `{other}` (expected tiny, flash or pro)"))),
    })
}

/// Quantization mix of a synthetic model, named as in the released files.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mix {
    /// Routed gate/up IQ2_XXS, down Q2_K.
    Q2,
    /// Routed experts Q4_K.
    Q4,
    /// Every ds4 Q8_0 and expert tensor as F16.
    F16,
}

impl Mix {
    pub fn parse(s: &str) -> Result<Self> {
        match s {
            "q2" => Ok(Self::Q2),
            "q4" => Ok(Self::Q4),
            "f16" => Ok(Self::F16),
            o => Err(ModelError::Invalid(format!("unknown quant mix `{o}` (expected q2, q4 or f16)"))),
        }
    }
    fn q8(self) -> GgmlType { if self == Self::F16 { GgmlType::F16 } else { GgmlType::Q8_0 } }
    fn experts(self) -> (GgmlType, GgmlType) {
        match self {
            Self::Q2 => (GgmlType::IQ2_XXS, GgmlType::Q2_K),
            Self::Q4 => (GgmlType::Q4_K, GgmlType::Q4_K),
            Self::F16 => (GgmlType::F16, GgmlType::F16),
        }
    }
}

/// Tokenizer data embedded in a synthetic file.
pub struct Vocab {
    pub tokens: Vec<String>,
    pub merges: Vec<String>,
    pub token_types: Vec<i32>,
    pub bos: u32,
    pub eos: u32,
}

/// How tensor values are produced.
#[derive(Debug, Clone, Copy)]
enum Init {
    /// Uniform in ±sqrt(3/cols) (unit-variance outputs).
    Matrix { cols: usize },
    /// 1 + noise (norm weights).
    Ones(f32),
    /// Uniform in ±a.
    Noise(f32),
    /// Hash routing table.
    Tid2Eid { n_expert: usize, k: usize },
}

struct TensorPlan {
    name: String,
    ty: GgmlType,
    dims: Vec<u64>,
    init: Init,
    /// Multiplies a matrix's values (the residual branches' output projections under `--gain`).
    gain: f32,
}

/// The ds4 tensor list of `cfg` (embedding, head, then layers) for layers `first..=last`, embedding/head as requested.
fn plan(cfg: &Config, mix: Mix, first: usize, last: usize, embed: bool, head: bool) -> Vec<TensorPlan> {
    use GgmlType::*;
    let mut v = Vec::new();
    let mut add = |name: String, ty: GgmlType, dims: &[usize], init: Init| {
        v.push(TensorPlan { name, ty, dims: dims.iter().map(|&d| d as u64).collect(), init, gain: 1.0 });
    };
    let (e, d) = (cfg.n_embd, cfg.head_dim);
    let q8 = mix.q8();
    if embed {
        add("token_embd.weight".into(), F16, &[e, cfg.n_vocab], Init::Noise(1.0));
    }
    // Top-level tensors first, as in the published files' tensor table.
    if head {
        add("output_hc_base.weight".into(), F32, &[cfg.n_hc], Init::Noise(0.5));
        add("output_hc_fn.weight".into(), F16, &[cfg.hc_dim(), cfg.n_hc], Init::Matrix { cols: cfg.hc_dim() });
        add("output_hc_scale.weight".into(), F32, &[1], Init::Noise(0.5));
        add("output_norm.weight".into(), F32, &[e], Init::Ones(0.1));
        add("output.weight".into(), q8, &[e, cfg.n_vocab], Init::Matrix { cols: e });
    }
    for il in first..=last {
        let p = |s: &str| format!("blk.{il}.{s}");
        let ratio = cfg.ratio(il);
        let coff = cfg.compress_coff(il);
        for kind in ["attn", "ffn"] {
            add(p(&format!("hc_{kind}_fn.weight")), F16, &[cfg.hc_dim(), cfg.hc_mix()], Init::Matrix { cols: cfg.hc_dim() });
            add(p(&format!("hc_{kind}_scale.weight")), F32, &[3], Init::Noise(0.5));
            add(p(&format!("hc_{kind}_base.weight")), F32, &[cfg.hc_mix()], Init::Noise(0.5));
            if kind == "attn" {
                add(p("attn_norm.weight"), F32, &[e], Init::Ones(0.1));
                add(p("attn_q_a.weight"), q8, &[e, cfg.q_lora], Init::Matrix { cols: e });
                add(p("attn_q_a_norm.weight"), F32, &[cfg.q_lora], Init::Ones(0.1));
                add(p("attn_q_b.weight"), q8, &[cfg.q_lora, cfg.q_dim()], Init::Matrix { cols: cfg.q_lora });
                add(p("attn_kv.weight"), q8, &[e, d], Init::Matrix { cols: e });
                add(p("attn_kv_a_norm.weight"), F32, &[d], Init::Ones(0.1));
                add(p("attn_sinks.weight"), F32, &[cfg.n_head], Init::Noise(1.0));
                let gin = cfg.heads_per_group() * d;
                add(p("attn_output_a.weight"), q8, &[gin, cfg.o_groups * cfg.o_lora], Init::Matrix { cols: gin });
                add(p("attn_output_b.weight"), q8, &[cfg.o_groups * cfg.o_lora, e], Init::Matrix { cols: cfg.o_groups * cfg.o_lora });
                if ratio != 0 {
                    add(p("attn_compressor_ape.weight"), F16, &[coff * d, ratio], Init::Noise(0.5));
                    add(p("attn_compressor_kv.weight"), F16, &[e, coff * d], Init::Matrix { cols: e });
                    add(p("attn_compressor_gate.weight"), F16, &[e, coff * d], Init::Matrix { cols: e });
                    add(p("attn_compressor_norm.weight"), F32, &[d], Init::Ones(0.1));
                }
                if ratio == 4 {
                    let id = cfg.idx_dim;
                    add(p("indexer.attn_q_b.weight"), F16, &[cfg.q_lora, cfg.idx_heads * id], Init::Matrix { cols: cfg.q_lora });
                    add(p("indexer.proj.weight"), F16, &[e, cfg.idx_heads], Init::Matrix { cols: e });
                    add(p("indexer_compressor_ape.weight"), F16, &[coff * id, ratio], Init::Noise(0.5));
                    add(p("indexer_compressor_kv.weight"), F16, &[e, coff * id], Init::Matrix { cols: e });
                    add(p("indexer_compressor_gate.weight"), F16, &[e, coff * id], Init::Matrix { cols: e });
                    add(p("indexer_compressor_norm.weight"), F32, &[id], Init::Ones(0.1));
                }
            }
        }
        add(p("ffn_norm.weight"), F32, &[e], Init::Ones(0.1));
        add(p("ffn_gate_inp.weight"), F16, &[e, cfg.n_expert], Init::Matrix { cols: e });
        if cfg.is_hash_layer(il) {
            add(p("ffn_gate_tid2eid.weight"), I32, &[cfg.n_expert_used, cfg.n_vocab], Init::Tid2Eid { n_expert: cfg.n_expert, k: cfg.n_expert_used });
        } else {
            add(p("exp_probs_b.bias"), F32, &[cfg.n_expert], Init::Noise(0.1));
        }
        let (gu, dn) = mix.experts();
        add(p("ffn_gate_exps.weight"), gu, &[e, cfg.ff_exp, cfg.n_expert], Init::Matrix { cols: e });
        add(p("ffn_up_exps.weight"), gu, &[e, cfg.ff_exp, cfg.n_expert], Init::Matrix { cols: e });
        add(p("ffn_down_exps.weight"), dn, &[cfg.ff_exp, e, cfg.n_expert], Init::Matrix { cols: cfg.ff_exp });
        if cfg.n_shared > 0 {
            add(p("ffn_gate_shexp.weight"), q8, &[e, cfg.ff_exp], Init::Matrix { cols: e });
            add(p("ffn_up_shexp.weight"), q8, &[e, cfg.ff_exp], Init::Matrix { cols: e });
            add(p("ffn_down_shexp.weight"), q8, &[cfg.ff_exp, e], Init::Matrix { cols: cfg.ff_exp });
        }
    }
    v
}

pub fn write_vocab_kv(w: &mut GgufWriter, v: &Vocab) {
    let strs = |xs: &[String]| MetaValue::Array(MetaType::Str, xs.iter().map(|s| MetaValue::Str(s.clone())).collect());
    w.add_kv("tokenizer.ggml.model", MetaValue::Str("gpt2".into()));
    w.add_kv("tokenizer.ggml.pre", MetaValue::Str("joyai-llm".into()));
    w.add_kv("tokenizer.ggml.tokens", strs(&v.tokens));
    w.add_kv("tokenizer.ggml.merges", strs(&v.merges));
    w.add_kv("tokenizer.ggml.token_type", MetaValue::Array(MetaType::I32, v.token_types.iter().map(|&t| MetaValue::I32(t)).collect()));
    w.add_kv("tokenizer.ggml.bos_token_id", MetaValue::U32(v.bos));
    w.add_kv("tokenizer.ggml.eos_token_id", MetaValue::U32(v.eos));
}

/// What to write.
pub struct SynthSpec<'a> {
    pub shape: &'a str,
    pub mix: Mix,
    pub seed: u64,
    /// Inclusive layer range; None = all layers with embedding and head.
    pub layers: Option<(usize, usize, bool)>,
    pub vocab: Option<&'a Vocab>,
}

/// The tensors that end a residual branch (attention output, routed and shared expert down projections).
/// Scaling them by a gain g < 1 makes every layer's update small next to the residual stream, so a
/// perturbation no longer grows layer after layer: a random network at gain 1 is chaotic at Flash depth
/// (a 1 % change at layer 0 changes the first token by layer 42), which makes full-depth comparisons of two
/// implementations meaningless.
fn is_branch_output(name: &str) -> bool {
    ["attn_output_b.weight", "ffn_down_exps.weight", "ffn_down_shexp.weight"].iter().any(|s| name.ends_with(s))
}

/// Writes the synthetic model; returns its config. Values depend only on (seed, tensor name), so a
/// layer-range file holds exactly the bytes of the same tensors in the full file.
pub fn write(spec: &SynthSpec, out: &Path, progress: impl FnMut(usize, usize)) -> Result<Config> {
    write_with_gain(spec, 1.0, out, progress)
}

/// [`write`] with the residual branches' output projections scaled by `gain` (1.0 = [`write`], byte for byte).
pub fn write_with_gain(spec: &SynthSpec, gain: f32, out: &Path, mut progress: impl FnMut(usize, usize)) -> Result<Config> {
    if !(gain.is_finite() && gain > 0.0) {
        return Err(ModelError::Invalid(format!("gain must be a positive number, got {gain}")));
    }
    let mut cfg = shape(spec.shape)?;
    if let Some(v) = spec.vocab {
        if cfg.n_vocab == 0 || spec.shape.starts_with("tiny") {
            cfg.n_vocab = v.tokens.len();
        } else if v.tokens.len() != cfg.n_vocab {
            return Err(ModelError::Invalid(format!("vocabulary has {} tokens, shape `{}` needs {}", v.tokens.len(), spec.shape, cfg.n_vocab)));
        }
    }
    if cfg.n_vocab == 0 {
        cfg.n_vocab = 512;
    }
    let (first, last, head) = spec.layers.unwrap_or((0, cfg.n_layer - 1, true));
    if first > last || last >= cfg.n_layer {
        return Err(ModelError::Invalid(format!("layer range {first}:{last} outside 0:{}", cfg.n_layer - 1)));
    }
    let mut tensors = plan(&cfg, spec.mix, first, last, first == 0, head);
    for t in tensors.iter_mut().filter(|t| is_branch_output(&t.name)) {
        t.gain = gain;
    }
    let mut w = GgufWriter::new();
    cfg.write_gguf(&mut w, &format!("DwarfStar synthetic {} ({:?})", spec.shape, spec.mix), 1048576);
    if spec.layers.is_some() {
        w.add_kv("ds4.shard.first_layer", MetaValue::U32(first as u32));
        w.add_kv("ds4.shard.last_layer", MetaValue::U32(last as u32));
        w.add_kv("ds4.shard.has_output", MetaValue::Bool(head));
    }
    if let Some(v) = spec.vocab {
        write_vocab_kv(&mut w, v);
    }
    for t in &tensors {
        w.add_tensor_info(&t.name, t.ty, &t.dims)?;
    }
    let mut stream = w.begin(out)?;
    let quantize_real = spec.shape.starts_with("tiny");
    for (i, t) in tensors.iter().enumerate() {
        progress(i, tensors.len());
        emit(&mut stream, t, spec.seed, quantize_real)?;
    }
    stream.finish()?;
    Ok(cfg)
}

/// Writes the MTP file (`mtp.0.*` tensors, the C engine's MTP GGUF layout) that matches the model
/// `spec` describes: one window-only block with biased top-k routing, `e_proj`/`h_proj` (Q8_0),
/// `enorm`/`hnorm`/`norm`, the MTP's own `hc_head_*`; HC functions and the router in F32, routed
/// experts Q4_K (F16 under the f16 mix), as in `DeepSeek-V4-Flash-MTP-Q4K-Q8_0-F32.gguf`. The
/// embedding and output matrix are the main model's (not in the file). Values depend only on (seed,
/// tensor name), like `write`'s.
pub fn write_mtp(spec: &SynthSpec, out: &Path, mut progress: impl FnMut(usize, usize)) -> Result<Config> {
    let cfg = shape(spec.shape)?;
    let bc = crate::mtp::block_config(&cfg);
    let il = cfg.n_layer;
    let blk = format!("blk.{il}.");
    let mut tensors = plan(&bc, spec.mix, il, il, false, false);
    let experts = if spec.mix == Mix::F16 { GgmlType::F16 } else { GgmlType::Q4_K };
    for t in tensors.iter_mut() {
        t.name = t.name.replacen(&blk, crate::weights::MTP_PREFIX, 1);
        if t.name.contains("hc_attn_fn") || t.name.contains("hc_ffn_fn") || t.name.ends_with("ffn_gate_inp.weight") {
            t.ty = GgmlType::F32;
        }
        if t.name.ends_with("_exps.weight") {
            t.ty = experts;
        }
    }
    let (e, p) = (cfg.n_embd, crate::weights::MTP_PREFIX);
    let q8 = spec.mix.q8();
    let mut add = |name: &str, ty: GgmlType, dims: &[usize], init: Init| {
        tensors.push(TensorPlan { name: format!("{p}{name}"), ty, dims: dims.iter().map(|&d| d as u64).collect(), init, gain: 1.0 });
    };
    add("e_proj.weight", q8, &[e, e], Init::Matrix { cols: e });
    add("h_proj.weight", q8, &[e, e], Init::Matrix { cols: e });
    add("enorm.weight", GgmlType::F32, &[e], Init::Ones(0.1));
    add("hnorm.weight", GgmlType::F32, &[e], Init::Ones(0.1));
    add("norm.weight", GgmlType::F32, &[e], Init::Ones(0.1));
    add("hc_head_base.weight", GgmlType::F32, &[cfg.n_hc], Init::Noise(0.5));
    add("hc_head_fn.weight", GgmlType::F32, &[cfg.hc_dim(), cfg.n_hc], Init::Matrix { cols: cfg.hc_dim() });
    add("hc_head_scale.weight", GgmlType::F32, &[1], Init::Noise(0.5));
    let mut w = GgufWriter::new();
    w.add_kv("general.architecture", MetaValue::Str("deepseek4_mtp_support".into()));
    w.add_kv("general.name", MetaValue::Str(format!("DwarfStar synthetic {} MTP ({:?})", spec.shape, spec.mix)));
    w.add_kv("deepseek4.embedding_length", MetaValue::U32(e as u32));
    w.add_kv("deepseek4.block_count", MetaValue::U32(cfg.n_layer as u32));
    for t in &tensors {
        w.add_tensor_info(&t.name, t.ty, &t.dims)?;
    }
    let mut stream = w.begin(out)?;
    let quantize_real = spec.shape.starts_with("tiny");
    for (i, t) in tensors.iter().enumerate() {
        progress(i, tensors.len());
        emit(&mut stream, t, spec.seed, quantize_real)?;
    }
    stream.finish()?;
    Ok(cfg)
}

/// Streams one tensor's bytes in chunks of whole rows.
fn emit(stream: &mut ds4_gguf::TensorStream, t: &TensorPlan, seed: u64, quantize_real: bool) -> Result<()> {
    let mut rng = Rng::new(seed ^ fnv(&t.name));
    let cols = t.dims[0] as usize;
    let rows: usize = t.dims[1..].iter().map(|&d| d as usize).product::<usize>().max(1);
    let rows_per_chunk = ((1 << 22) / cols.max(1)).max(1);
    if let (Init::Matrix { cols: fan_in }, false) = (t.init, quantize_real) {
        if !matches!(t.ty, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16) {
            return blocks_parallel(rng, t.ty, rows, cols, rows_per_chunk, (3.0 / fan_in as f32).sqrt() * t.gain, |b| Ok(stream.write(b)?));
        }
    }
    let mut r0 = 0;
    let mut fbuf = Vec::new();
    while r0 < rows {
        let nr = rows_per_chunk.min(rows - r0);
        let n = nr * cols;
        let bytes: Vec<u8> = match (t.init, t.ty) {
            (Init::Tid2Eid { n_expert, k }, _) => {
                let mut out = Vec::with_capacity(n * 4);
                // dims [k, vocab]: each row (token) gets k distinct experts.
                for _ in 0..nr {
                    let mut ids = Vec::with_capacity(k);
                    while ids.len() < k {
                        let e = (rng.next() % n_expert as u64) as i32;
                        if !ids.contains(&e) {
                            ids.push(e);
                        }
                    }
                    ids.iter().for_each(|e| out.extend_from_slice(&e.to_le_bytes()));
                }
                out
            }
            (init, ty) if quantize_real || matches!(ty, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16) => {
                fbuf.resize(n, 0.0);
                fill(&mut rng, init, &mut fbuf);
                if t.gain != 1.0 {
                    fbuf.iter_mut().for_each(|v| *v *= t.gain);
                }
                if ty == GgmlType::F16 {
                    fbuf.iter().flat_map(|&v| f16::from_f32(v).to_le_bytes()).collect()
                } else {
                    ds4_quant::quantize(ty, &fbuf)?
                }
            }
            (Init::Matrix { cols }, ty) => random_blocks(&mut rng, ty, n, (3.0 / cols as f32).sqrt() * t.gain),
            (_, ty) => return Err(ModelError::Invalid(format!("no synthetic generator for {} tensor {}", ty.name(), t.name))),
        };
        stream.write(&bytes)?;
        r0 += nr;
    }
    Ok(())
}

/// Random valid blocks of a `rows` x `cols` matrix, chunks of `rows_per_chunk` rows generated on all
/// cores and written in order. Byte-identical to drawing the chunks one after another from `rng`:
/// splitmix64's state after k draws is the seed plus k steps, and a chunk of b bytes takes ceil(b / 8)
/// draws, so chunk c starts c full chunks' draws on. (A Flash-sized file took ~2 min on one core.)
fn blocks_parallel(rng: Rng, ty: GgmlType, rows: usize, cols: usize, rows_per_chunk: usize, a: f32, mut write: impl FnMut(&[u8]) -> Result<()>) -> Result<()> {
    use rayon::prelude::*;
    let draws = |nr: usize| ((nr * cols / ty.block_elems() * ty.block_bytes()).div_ceil(8)) as u64;
    let per_chunk = draws(rows_per_chunk);
    let nchunks = rows.div_ceil(rows_per_chunk);
    // A bounded batch in memory at a time (a few chunks per thread).
    let batch = 4 * rayon::current_num_threads().max(1);
    for b0 in (0..nchunks).step_by(batch) {
        let bufs: Vec<Vec<u8>> = (b0..nchunks.min(b0 + batch))
            .into_par_iter()
            .map(|c| {
                let nr = rows_per_chunk.min(rows - c * rows_per_chunk);
                let mut r = rng.skipped(c as u64 * per_chunk);
                random_blocks(&mut r, ty, nr * cols, a)
            })
            .collect();
        for b in &bufs {
            write(b)?;
        }
    }
    Ok(())
}

fn fill(rng: &mut Rng, init: Init, out: &mut [f32]) {
    match init {
        Init::Matrix { cols } => {
            let a = (3.0 / cols as f32).sqrt();
            out.iter_mut().for_each(|v| *v = rng.uniform() * a);
        }
        Init::Ones(a) => out.iter_mut().for_each(|v| *v = 1.0 + rng.uniform() * a),
        Init::Noise(a) => out.iter_mut().for_each(|v| *v = rng.uniform() * a),
        Init::Tid2Eid { .. } => unreachable!("handled by the caller"),
    }
}

/// Random but valid quantized blocks whose values have roughly magnitude `a` (fast path for huge shapes).
fn random_blocks(rng: &mut Rng, ty: GgmlType, n: usize, a: f32) -> Vec<u8> {
    let nb = n / ty.block_elems();
    let bb = ty.block_bytes();
    let mut out = vec![0u8; nb * bb];
    rng.fill_bytes(&mut out);
    let h = |v: f32| f16::from_f32(v).to_le_bytes();
    for b in out.chunks_exact_mut(bb) {
        match ty {
            GgmlType::Q8_0 => b[0..2].copy_from_slice(&h(a / 127.0)),
            GgmlType::Q2_K => {
                b[80..82].copy_from_slice(&h(a / 22.0));
                b[82..84].copy_from_slice(&h(a / 15.0));
            }
            GgmlType::Q4_K => {
                b[0..2].copy_from_slice(&h(a / 240.0));
                b[2..4].copy_from_slice(&h(a / 32.0));
            }
            GgmlType::IQ2_XXS => b[0..2].copy_from_slice(&h(a / 60.0)),
            _ => {}
        }
    }
    out
}

fn fnv(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| (h ^ b as u64).wrapping_mul(0x100_0000_01b3))
}

/// splitmix64: tiny, deterministic, good enough for synthetic weights.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Self { Self(seed) }
    /// The generator `k` draws on.
    fn skipped(&self, k: u64) -> Self { Self(self.0.wrapping_add(k.wrapping_mul(0x9e37_79b9_7f4a_7c15))) }
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// Uniform in [-1, 1).
    fn uniform(&mut self) -> f32 { (self.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0 }
    fn fill_bytes(&mut self, out: &mut [u8]) {
        for c in out.chunks_mut(8) {
            let v = self.next().to_le_bytes();
            c.copy_from_slice(&v[..c.len()]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parallel_blocks_equal_sequential_draws() {
        // 37 rows in chunks of 5 (a short last chunk); block sizes not multiples of 8 bytes included.
        for ty in [GgmlType::Q8_0, GgmlType::Q2_K, GgmlType::Q4_K, GgmlType::IQ2_XXS] {
            let (rows, cols, per) = (37usize, 512usize, 5usize);
            let mut rng = Rng::new(9);
            let mut want = Vec::new();
            let mut r0 = 0;
            while r0 < rows {
                let nr = per.min(rows - r0);
                want.extend(random_blocks(&mut rng, ty, nr * cols, 0.1));
                r0 += nr;
            }
            let mut got = Vec::new();
            blocks_parallel(Rng::new(9), ty, rows, cols, per, 0.1, |b| {
                got.extend_from_slice(b);
                Ok(())
            })
            .unwrap();
            assert!(got == want, "{} differs", ty.name());
        }
    }
}
