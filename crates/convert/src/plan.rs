//! The GGUF tensor list for a config and mix: names, types, dims, and where each comes from.
//! Mapping table: tools/reference/HF_MAPPING.md §1.
use crate::source::Source;
use crate::{ConvertError, HfConfig, QuantMix};
use ds4_gguf::GgmlType;

/// One checkpoint tensor a GGUF tensor is made from, with its expected torch shape.
#[derive(Debug, Clone, PartialEq)]
pub struct Src {
    pub name: String,
    pub shape: Vec<usize>,
}

/// How the source bytes become the GGUF tensor's values.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Kind {
    /// Same element order (torch `[a, b]` row-major = GGUF `[b, a]`).
    Plain,
    /// Rows `[first, first + rows)` of every expert of a `[E, 2I, H]` fused gate_up tensor.
    ExpertRows { first: usize, rows: usize },
    /// int64 `[V, k]` → I32, values in `[0, n_experts)`.
    Tid2Eid { n_experts: usize },
}

/// ds4's type class of a tensor (spec §4.4), resolved per mix.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Class {
    /// norms, biases, sinks, HC scale/base: always F32.
    F32,
    /// embedding, HC fns, compressor, indexer, router: F16 (F32 in the f32 mix).
    F16,
    /// attention projections, shared experts, output: Q8_0 (F16 / F32 in the f16 / f32 mixes).
    Q8,
    /// routed gate/up experts.
    ExpGateUp,
    /// routed down experts.
    ExpDown,
    Tid2Eid,
}

fn ty_of(c: Class, mix: QuantMix) -> GgmlType {
    use GgmlType as T;
    use QuantMix as M;
    match (c, mix) {
        (Class::F32, _) => T::F32,
        (Class::Tid2Eid, _) => T::I32,
        (_, M::F32) => T::F32,
        (_, M::F16) => T::F16,
        (Class::F16, _) => T::F16,
        (Class::Q8, _) => T::Q8_0,
        (Class::ExpGateUp | Class::ExpDown, M::Q8) => T::Q8_0,
        (Class::ExpGateUp | Class::ExpDown, M::Q4) => T::Q4_K,
        (Class::ExpGateUp, M::Q2) => T::IQ2_XXS,
        (Class::ExpDown, M::Q2) => T::Q2_K,
    }
}

/// One GGUF tensor to write.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorPlan {
    pub name: String,
    pub ty: GgmlType,
    /// GGUF order, dims[0] contiguous.
    pub dims: Vec<u64>,
    pub sources: Vec<Src>,
    pub kind: Kind,
    /// Source is an integer tensor.
    pub int: bool,
}

/// Every GGUF tensor for `cfg` in file order.
pub fn plan(c: &HfConfig, mix: QuantMix) -> Vec<TensorPlan> {
    let mut out = Vec::new();
    let mut push = |gguf: String, class: Class, dims: Vec<usize>, src: &str, src_shape: Vec<usize>, kind: Kind| {
        out.push(TensorPlan {
            name: gguf,
            ty: ty_of(class, mix),
            dims: dims.iter().map(|&d| d as u64).collect(),
            sources: vec![Src { name: src.to_string(), shape: src_shape }],
            kind,
            int: class == Class::Tid2Eid,
        });
    };
    // A 2-D torch weight [out, in] = GGUF [in, out]; 1-D the same.
    let (h, v, hc) = (c.hidden_size, c.vocab_size, c.hc_mult);
    let mix_n = (2 + hc) * hc;
    let (nh, hd, ql) = (c.n_heads, c.head_dim, c.q_lora_rank);
    let (g, ol) = (c.o_groups, c.o_lora_rank);
    let (ne, k, inter) = (c.n_experts, c.n_experts_used, c.moe_intermediate);
    let (ih, id) = (c.index_n_heads, c.index_head_dim);

    push("token_embd.weight".into(), Class::F16, vec![h, v], "model.embed_tokens.weight", vec![v, h], Kind::Plain);
    for il in 0..c.n_layers {
        let b = |s: &str| format!("blk.{il}.{s}");
        let m = |s: &str| format!("model.layers.{il}.{s}");
        let ratio = c.compress_ratios[il];
        for (site, hs) in [("attn", "attn_hc"), ("ffn", "ffn_hc")] {
            push(b(&format!("hc_{site}_fn.weight")), Class::F16, vec![hc * h, mix_n], &m(&format!("{hs}.fn")), vec![mix_n, hc * h], Kind::Plain);
            push(b(&format!("hc_{site}_scale.weight")), Class::F32, vec![3], &m(&format!("{hs}.scale")), vec![3], Kind::Plain);
            push(b(&format!("hc_{site}_base.weight")), Class::F32, vec![mix_n], &m(&format!("{hs}.base")), vec![mix_n], Kind::Plain);
        }
        push(b("attn_norm.weight"), Class::F32, vec![h], &m("input_layernorm.weight"), vec![h], Kind::Plain);
        push(b("attn_q_a.weight"), Class::Q8, vec![h, ql], &m("self_attn.q_a_proj.weight"), vec![ql, h], Kind::Plain);
        push(b("attn_q_a_norm.weight"), Class::F32, vec![ql], &m("self_attn.q_a_norm.weight"), vec![ql], Kind::Plain);
        push(b("attn_q_b.weight"), Class::Q8, vec![ql, nh * hd], &m("self_attn.q_b_proj.weight"), vec![nh * hd, ql], Kind::Plain);
        push(b("attn_kv.weight"), Class::Q8, vec![h, hd], &m("self_attn.kv_proj.weight"), vec![hd, h], Kind::Plain);
        push(b("attn_kv_a_norm.weight"), Class::F32, vec![hd], &m("self_attn.kv_norm.weight"), vec![hd], Kind::Plain);
        push(b("attn_sinks.weight"), Class::F32, vec![nh], &m("self_attn.sinks"), vec![nh], Kind::Plain);
        let gin = nh * hd / g;
        push(b("attn_output_a.weight"), Class::Q8, vec![gin, g * ol], &m("self_attn.o_a_proj.weight"), vec![g * ol, gin], Kind::Plain);
        push(b("attn_output_b.weight"), Class::Q8, vec![g * ol, h], &m("self_attn.o_b_proj.weight"), vec![h, g * ol], Kind::Plain);
        if ratio != 0 {
            let coff = if ratio == 4 { 2 } else { 1 };
            let w = coff * hd;
            push(b("attn_compressor_ape.weight"), Class::F16, vec![w, ratio], &m("self_attn.compressor.position_bias"), vec![ratio, w], Kind::Plain);
            push(b("attn_compressor_kv.weight"), Class::F16, vec![h, w], &m("self_attn.compressor.kv_proj.weight"), vec![w, h], Kind::Plain);
            push(b("attn_compressor_gate.weight"), Class::F16, vec![h, w], &m("self_attn.compressor.gate_proj.weight"), vec![w, h], Kind::Plain);
            push(b("attn_compressor_norm.weight"), Class::F32, vec![hd], &m("self_attn.compressor.kv_norm.weight"), vec![hd], Kind::Plain);
        }
        if ratio == 4 {
            let x = |s: &str| m(&format!("self_attn.compressor.indexer.{s}"));
            push(b("indexer.attn_q_b.weight"), Class::F16, vec![ql, ih * id], &x("q_b_proj.weight"), vec![ih * id, ql], Kind::Plain);
            push(b("indexer.proj.weight"), Class::F16, vec![h, ih], &x("scorer.weights_proj.weight"), vec![ih, h], Kind::Plain);
            push(b("indexer_compressor_ape.weight"), Class::F16, vec![2 * id, 4], &x("position_bias"), vec![4, 2 * id], Kind::Plain);
            push(b("indexer_compressor_kv.weight"), Class::F16, vec![h, 2 * id], &x("kv_proj.weight"), vec![2 * id, h], Kind::Plain);
            push(b("indexer_compressor_gate.weight"), Class::F16, vec![h, 2 * id], &x("gate_proj.weight"), vec![2 * id, h], Kind::Plain);
            push(b("indexer_compressor_norm.weight"), Class::F32, vec![id], &x("kv_norm.weight"), vec![id], Kind::Plain);
        }
        push(b("ffn_norm.weight"), Class::F32, vec![h], &m("post_attention_layernorm.weight"), vec![h], Kind::Plain);
        push(b("ffn_gate_inp.weight"), Class::F16, vec![h, ne], &m("mlp.gate.weight"), vec![ne, h], Kind::Plain);
        if il < c.n_hash_layers {
            push(b("ffn_gate_tid2eid.weight"), Class::Tid2Eid, vec![k, v], &m("mlp.gate.tid2eid"), vec![v, k], Kind::Tid2Eid { n_experts: ne });
        } else {
            push(b("exp_probs_b.bias"), Class::F32, vec![ne], &m("mlp.gate.e_score_correction_bias"), vec![ne], Kind::Plain);
        }
        let gu = m("mlp.experts.gate_up_proj");
        push(b("ffn_gate_exps.weight"), Class::ExpGateUp, vec![h, inter, ne], &gu, vec![ne, 2 * inter, h], Kind::ExpertRows { first: 0, rows: inter });
        push(b("ffn_up_exps.weight"), Class::ExpGateUp, vec![h, inter, ne], &gu, vec![ne, 2 * inter, h], Kind::ExpertRows { first: inter, rows: inter });
        push(b("ffn_down_exps.weight"), Class::ExpDown, vec![inter, h, ne], &m("mlp.experts.down_proj"), vec![ne, h, inter], Kind::Plain);
        push(b("ffn_gate_shexp.weight"), Class::Q8, vec![h, inter], &m("mlp.shared_experts.gate_proj.weight"), vec![inter, h], Kind::Plain);
        push(b("ffn_up_shexp.weight"), Class::Q8, vec![h, inter], &m("mlp.shared_experts.up_proj.weight"), vec![inter, h], Kind::Plain);
        push(b("ffn_down_shexp.weight"), Class::Q8, vec![inter, h], &m("mlp.shared_experts.down_proj.weight"), vec![h, inter], Kind::Plain);
    }
    push("output_hc_base.weight".into(), Class::F32, vec![hc], "model.hc_head.hc_base", vec![hc], Kind::Plain);
    push("output_hc_fn.weight".into(), Class::F16, vec![hc * h, hc], "model.hc_head.hc_fn", vec![hc, hc * h], Kind::Plain);
    push("output_hc_scale.weight".into(), Class::F32, vec![1], "model.hc_head.hc_scale", vec![1], Kind::Plain);
    push("output_norm.weight".into(), Class::F32, vec![h], "model.norm.weight", vec![h], Kind::Plain);
    push("output.weight".into(), Class::Q8, vec![h, v], "lm_head.weight", vec![v, h], Kind::Plain);
    out
}

/// The bytes of one GGUF tensor.
pub(crate) fn produce(p: &TensorPlan, src: &Source) -> Result<Vec<u8>, ConvertError> {
    let s = &p.sources[0];
    let vals: Vec<f32> = match p.kind {
        Kind::Tid2Eid { n_experts } => {
            let ids = src.i64s(&s.name, &p.name)?;
            let mut out = Vec::with_capacity(ids.len() * 4);
            for (i, &e) in ids.iter().enumerate() {
                if e < 0 || e as u64 >= n_experts as u64 {
                    return Err(ConvertError::Value {
                        name: s.name.clone(),
                        index: i,
                        value: e.to_string(),
                        problem: format!("expert id must be in [0, {n_experts})"),
                    });
                }
                out.extend_from_slice(&(e as i32).to_le_bytes());
            }
            return Ok(out);
        }
        Kind::Plain => src.f32s(&s.name, &p.name)?,
        Kind::ExpertRows { first, rows } => {
            let all = src.f32s(&s.name, &p.name)?;
            let (ne, total, cols) = (s.shape[0], s.shape[1], s.shape[2]);
            let mut out = Vec::with_capacity(ne * rows * cols);
            for e in 0..ne {
                let base = (e * total + first) * cols;
                out.extend_from_slice(&all[base..base + rows * cols]);
            }
            out
        }
    };
    encode(p, &vals)
}

fn encode(p: &TensorPlan, vals: &[f32]) -> Result<Vec<u8>, ConvertError> {
    match p.ty {
        GgmlType::F32 => Ok(vals.iter().flat_map(|x| x.to_le_bytes()).collect()),
        GgmlType::F16 => {
            if let Some(i) = vals.iter().position(|x| x.abs() > 65504.0) {
                return Err(ConvertError::Value {
                    name: p.name.clone(),
                    index: i,
                    value: vals[i].to_string(),
                    problem: "outside the F16 range; use the f32 mix".into(),
                });
            }
            Ok(vals.iter().flat_map(|&x| half::f16::from_f32(x).to_le_bytes()).collect())
        }
        ty => ds4_quant::quantize(ty, vals).map_err(|e| ConvertError::Quant { name: p.name.clone(), ty: ty.name(), problem: e.to_string() }),
    }
}
