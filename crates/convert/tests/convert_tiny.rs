//! Converts the committed transformers tiny-f32 checkpoint (crates/model/tests/fixtures/hf_tiny) and
//! checks names, types, dims, metadata and a few values against tools/reference/HF_MAPPING.md; then
//! hostile inputs.
use ds4_convert::{convert, ConvertError, QuantMix};
use ds4_gguf::{GgmlType, GgufFile, MetaValue};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

fn fixture_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../model/tests/fixtures/hf_tiny")
}

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("ds4-convert-test-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Expected (type, dims) of every tensor of the tiny config, written out from the mapping table
/// (hidden 64, vocab 256, 4 layers ratios [0,4,128,4], hash layers 0,1, heads 4x128, q_lora 16,
/// o_groups 2 x 16, 6 experts top-3, I 32, 16 indexer heads x 128, hc 4).
fn expected(mix: QuantMix) -> BTreeMap<String, (GgmlType, Vec<u64>)> {
    use GgmlType::*;
    let f16 = if mix == QuantMix::F32 { F32 } else { F16 };
    let q8 = match mix {
        QuantMix::F32 => F32,
        QuantMix::F16 => F16,
        _ => Q8_0,
    };
    let (eg, ed) = match mix {
        QuantMix::F32 => (F32, F32),
        QuantMix::F16 => (F16, F16),
        QuantMix::Q8 => (Q8_0, Q8_0),
        QuantMix::Q4 => (Q4_K, Q4_K),
        QuantMix::Q2 => (IQ2_XXS, Q2_K),
    };
    let mut m = BTreeMap::new();
    let mut add = |n: String, t: GgmlType, d: &[u64]| {
        assert!(m.insert(n, (t, d.to_vec())).is_none());
    };
    add("token_embd.weight".into(), f16, &[64, 256]);
    add("output.weight".into(), q8, &[64, 256]);
    add("output_norm.weight".into(), F32, &[64]);
    add("output_hc_fn.weight".into(), f16, &[256, 4]);
    add("output_hc_base.weight".into(), F32, &[4]);
    add("output_hc_scale.weight".into(), F32, &[1]);
    for (il, ratio) in [0u64, 4, 128, 4].into_iter().enumerate() {
        let b = |s: &str| format!("blk.{il}.{s}");
        for site in ["attn", "ffn"] {
            add(b(&format!("hc_{site}_fn.weight")), f16, &[256, 24]);
            add(b(&format!("hc_{site}_scale.weight")), F32, &[3]);
            add(b(&format!("hc_{site}_base.weight")), F32, &[24]);
        }
        add(b("attn_norm.weight"), F32, &[64]);
        add(b("ffn_norm.weight"), F32, &[64]);
        add(b("attn_q_a.weight"), q8, &[64, 16]);
        add(b("attn_q_a_norm.weight"), F32, &[16]);
        add(b("attn_q_b.weight"), q8, &[16, 512]);
        add(b("attn_kv.weight"), q8, &[64, 128]);
        add(b("attn_kv_a_norm.weight"), F32, &[128]);
        add(b("attn_sinks.weight"), F32, &[4]);
        add(b("attn_output_a.weight"), q8, &[256, 32]);
        add(b("attn_output_b.weight"), q8, &[32, 64]);
        if ratio != 0 {
            let w = if ratio == 4 { 256 } else { 128 };
            add(b("attn_compressor_ape.weight"), f16, &[w, ratio]);
            add(b("attn_compressor_kv.weight"), f16, &[64, w]);
            add(b("attn_compressor_gate.weight"), f16, &[64, w]);
            add(b("attn_compressor_norm.weight"), F32, &[128]);
        }
        if ratio == 4 {
            add(b("indexer.attn_q_b.weight"), f16, &[16, 2048]);
            add(b("indexer.proj.weight"), f16, &[64, 16]);
            add(b("indexer_compressor_ape.weight"), f16, &[256, 4]);
            add(b("indexer_compressor_kv.weight"), f16, &[64, 256]);
            add(b("indexer_compressor_gate.weight"), f16, &[64, 256]);
            add(b("indexer_compressor_norm.weight"), F32, &[128]);
        }
        add(b("ffn_gate_inp.weight"), f16, &[64, 6]);
        if il < 2 {
            add(b("ffn_gate_tid2eid.weight"), I32, &[3, 256]);
        } else {
            add(b("exp_probs_b.bias"), F32, &[6]);
        }
        add(b("ffn_gate_exps.weight"), eg, &[64, 32, 6]);
        add(b("ffn_up_exps.weight"), eg, &[64, 32, 6]);
        add(b("ffn_down_exps.weight"), ed, &[32, 64, 6]);
        add(b("ffn_gate_shexp.weight"), q8, &[64, 32]);
        add(b("ffn_up_shexp.weight"), q8, &[64, 32]);
        add(b("ffn_down_shexp.weight"), q8, &[32, 64]);
    }
    m
}

fn actual(f: &GgufFile) -> BTreeMap<String, (GgmlType, Vec<u64>)> {
    f.tensors().iter().map(|t| (t.name.clone(), (t.ty, t.dims.clone()))).collect()
}

fn f32s(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect()
}

/// A tensor of the fixture checkpoint as f32 (all float tensors there are F32).
fn ckpt_tensor(name: &str) -> (Vec<usize>, Vec<u8>) {
    let bytes = std::fs::read(fixture_dir().join("model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let t = st.tensor(name).unwrap();
    (t.shape().to_vec(), t.data().to_vec())
}

#[test]
fn tiny_f32_names_types_dims_metadata_values() {
    let d = tmp("f32");
    let out = d.join("tiny.gguf");
    let s = convert(&fixture_dir(), &out, QuantMix::F32).unwrap();
    assert!(s.unused.is_empty(), "unused checkpoint tensors: {:?}", s.unused);
    let f = GgufFile::open(&out).unwrap();
    assert_eq!(actual(&f), expected(QuantMix::F32));

    // metadata from config.json
    let u = |k: &str| f.get_u32(&format!("deepseek4.{k}")).unwrap();
    let fl = |k: &str| f.get_f32(&format!("deepseek4.{k}")).unwrap();
    assert_eq!(f.get_str("general.architecture").unwrap(), "deepseek4");
    for (k, v) in [
        ("block_count", 4), ("embedding_length", 64), ("vocab_size", 256), ("attention.head_count", 4),
        ("attention.head_count_kv", 1), ("attention.key_length", 128), ("attention.value_length", 128),
        ("rope.dimension_count", 64), ("attention.q_lora_rank", 16), ("attention.output_lora_rank", 16),
        ("attention.output_group_count", 2), ("expert_count", 6), ("expert_used_count", 3),
        ("expert_feed_forward_length", 32), ("expert_shared_count", 1), ("hash_layer_count", 2),
        ("attention.sliding_window", 128), ("attention.indexer.head_count", 16),
        ("attention.indexer.key_length", 128), ("attention.indexer.top_k", 16), ("hyper_connection.count", 4),
        ("hyper_connection.sinkhorn_iterations", 20), ("expert_gating_func", 4), ("context_length", 1048576),
        ("rope.scaling.original_context_length", 65536), ("expert_group_count", 0),
    ] {
        assert_eq!(u(k), v, "deepseek4.{k}");
    }
    for (k, v) in [
        ("rope.freq_base", 10000.0), ("attention.compress_rope_freq_base", 160000.0), ("rope.scaling.factor", 16.0),
        ("rope.scaling.yarn_beta_fast", 32.0), ("rope.scaling.yarn_beta_slow", 1.0), ("expert_weights_scale", 1.5),
        ("attention.layer_norm_rms_epsilon", 1e-6), ("hyper_connection.epsilon", 1e-6),
    ] {
        assert_eq!(fl(k), v, "deepseek4.{k}");
    }
    assert_eq!(f.get_str("deepseek4.rope.scaling.type").unwrap(), "yarn");
    assert!(f.get_bool("deepseek4.expert_weights_norm").unwrap());
    assert_eq!(f.get_u32_array("deepseek4.attention.compress_ratios").unwrap(), vec![0, 4, 128, 4]);
    assert_eq!(f.get_f32_array("deepseek4.swiglu_clamp_exp").unwrap(), vec![10.0; 4]);
    assert_eq!(f.get_str("tokenizer.ggml.pre").unwrap(), "joyai-llm");
    assert_eq!(f.get_str_array("tokenizer.ggml.tokens").unwrap().len(), 256);

    // values: plain copy, fused gate/up split, tid2eid cast
    let (_, kv) = ckpt_tensor("model.layers.1.self_attn.compressor.kv_proj.weight");
    assert_eq!(f.tensor_bytes("blk.1.attn_compressor_kv.weight").unwrap(), &kv[..]);
    let (_, ape) = ckpt_tensor("model.layers.2.self_attn.compressor.position_bias");
    assert_eq!(f.tensor_bytes("blk.2.attn_compressor_ape.weight").unwrap(), &ape[..]);
    let (shape, gu) = ckpt_tensor("model.layers.3.mlp.experts.gate_up_proj");
    assert_eq!(shape, vec![6, 64, 64]);
    let gu = f32s(&gu);
    let gate = f32s(f.tensor_bytes("blk.3.ffn_gate_exps.weight").unwrap());
    let up = f32s(f.tensor_bytes("blk.3.ffn_up_exps.weight").unwrap());
    for e in 0..6 {
        for r in 0..32 {
            for c in 0..64 {
                assert_eq!(gate[(e * 32 + r) * 64 + c], gu[(e * 64 + r) * 64 + c]);
                assert_eq!(up[(e * 32 + r) * 64 + c], gu[(e * 64 + 32 + r) * 64 + c]);
            }
        }
    }
    let (shape, t) = ckpt_tensor("model.layers.0.mlp.gate.tid2eid");
    assert_eq!(shape, vec![256, 3]);
    let ids: Vec<i32> = t.chunks_exact(8).map(|c| i64::from_le_bytes(c.try_into().unwrap()) as i32).collect();
    let got: Vec<i32> =
        f.tensor_bytes("blk.0.ffn_gate_tid2eid.weight").unwrap().chunks_exact(4).map(|c| i32::from_le_bytes(c.try_into().unwrap())).collect();
    assert_eq!(got, ids);

    // the model crate accepts the metadata
    let cfg = ds4_model::Config::from_gguf(&f).unwrap();
    assert_eq!(cfg.compress_ratios, vec![0, 4, 128, 4]);
    assert_eq!(cfg.n_hash_layer, 2);
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn tiny_f16_types() {
    let d = tmp("f16");
    let out = d.join("tiny.gguf");
    convert(&fixture_dir(), &out, QuantMix::F16).unwrap();
    let f = GgufFile::open(&out).unwrap();
    assert_eq!(actual(&f), expected(QuantMix::F16));
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn q8_on_tiny_names_the_tensor_whose_row_is_not_a_block_multiple() {
    // q_lora_rank 16: attn_q_b's rows (ne0 = 16) cannot be Q8_0 (block 32)
    let d = tmp("q8");
    let e = convert(&fixture_dir(), &d.join("x.gguf"), QuantMix::Q8).unwrap_err();
    let msg = e.to_string();
    assert!(matches!(e, ConvertError::Block { .. }), "{msg}");
    assert!(msg.contains("blk.0.attn_q_b.weight") && msg.contains("Q8_0"), "{msg}");
    assert!(!d.join("x.gguf").exists(), "nothing is written when the check fails");
    let _ = std::fs::remove_dir_all(&d);
}

/// A copy of the fixture checkpoint with an edited config.json and/or tensor set.
fn hostile(
    tag: &str,
    edit_cfg: impl FnOnce(&mut serde_json::Map<String, serde_json::Value>),
    edit_tensors: impl FnOnce(&mut Vec<(String, safetensors::Dtype, Vec<usize>, Vec<u8>)>),
) -> PathBuf {
    let d = tmp(tag);
    let src = fixture_dir();
    let mut cfg: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(src.join("config.json")).unwrap()).unwrap();
    edit_cfg(cfg.as_object_mut().unwrap());
    std::fs::write(d.join("config.json"), serde_json::to_string(&cfg).unwrap()).unwrap();
    let bytes = std::fs::read(src.join("model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut ts: Vec<_> = st.tensors().into_iter().map(|(n, v)| (n, v.dtype(), v.shape().to_vec(), v.data().to_vec())).collect();
    ts.sort_by(|a, b| a.0.cmp(&b.0));
    edit_tensors(&mut ts);
    let views: Vec<(String, safetensors::tensor::TensorView)> = ts
        .iter()
        .map(|(n, dt, sh, data)| (n.clone(), safetensors::tensor::TensorView::new(*dt, sh.clone(), data).unwrap()))
        .collect();
    safetensors::serialize_to_file(views, None, &d.join("model.safetensors")).unwrap();
    d
}

fn err_of(dir: &Path) -> String {
    let e = convert(dir, &dir.join("out.gguf"), QuantMix::F32).unwrap_err().to_string();
    let _ = std::fs::remove_dir_all(dir);
    e
}

#[test]
fn missing_config_key() {
    let d = hostile("nokey", |c| { c.remove("hidden_size"); }, |_| {});
    let e = err_of(&d);
    assert!(e.contains("hidden_size") && e.contains("missing"), "{e}");
}

#[test]
fn missing_layer_map_and_rope_scaling() {
    let d = hostile("nomap", |c| { c.remove("compress_ratios"); }, |_| {});
    let e = err_of(&d);
    assert!(e.contains("compress_ratios"), "{e}");
    let d = hostile("norope", |c| { c.remove("rope_scaling"); }, |_| {});
    let e = err_of(&d);
    assert!(e.contains("rope_scaling"), "{e}");
    let d = hostile("badratio", |c| { c.insert("compress_ratios".into(), serde_json::json!([0, 4, 64, 4])); }, |_| {});
    let e = err_of(&d);
    assert!(e.contains("compress_ratios") && e.contains("layer 2"), "{e}");
}

#[test]
fn wrong_shape() {
    let d = hostile("shape", |_| {}, |ts| {
        let t = ts.iter_mut().find(|t| t.0 == "model.layers.1.self_attn.kv_proj.weight").unwrap();
        t.2 = vec![64, 128];
    });
    let e = err_of(&d);
    assert!(e.contains("model.layers.1.self_attn.kv_proj.weight") && e.contains("[128, 64]"), "{e}");
}

#[test]
fn missing_tensor() {
    let d = hostile("missing", |_| {}, |ts| ts.retain(|t| t.0 != "model.layers.3.mlp.experts.down_proj"));
    let e = err_of(&d);
    assert!(e.contains("model.layers.3.mlp.experts.down_proj") && e.contains("blk.3.ffn_down_exps.weight"), "{e}");
}

#[test]
fn bad_tid2eid_and_nan() {
    let d = hostile("tid", |_| {}, |ts| {
        let t = ts.iter_mut().find(|t| t.0 == "model.layers.0.mlp.gate.tid2eid").unwrap();
        t.3[8..16].copy_from_slice(&99i64.to_le_bytes());
    });
    let e = err_of(&d);
    assert!(e.contains("tid2eid") && e.contains("99"), "{e}");
    let d = hostile("nan", |_| {}, |ts| {
        let t = ts.iter_mut().find(|t| t.0 == "model.norm.weight").unwrap();
        t.3[0..4].copy_from_slice(&f32::NAN.to_le_bytes());
    });
    let e = err_of(&d);
    assert!(e.contains("model.norm.weight") && e.contains("not finite"), "{e}");
}

#[test]
fn garbage_files() {
    let d = tmp("garbage");
    std::fs::write(d.join("config.json"), "{not json").unwrap();
    let e = convert(&d, &d.join("o.gguf"), QuantMix::F32).unwrap_err().to_string();
    assert!(e.contains("config.json"), "{e}");
    std::fs::copy(fixture_dir().join("config.json"), d.join("config.json")).unwrap();
    let e = convert(&d, &d.join("o.gguf"), QuantMix::F32).unwrap_err().to_string();
    assert!(e.contains("no *.safetensors"), "{e}");
    std::fs::write(d.join("model.safetensors"), [0xffu8; 64]).unwrap();
    let e = convert(&d, &d.join("o.gguf"), QuantMix::F32).unwrap_err().to_string();
    assert!(e.contains("model.safetensors"), "{e}");
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn mix_parse() {
    assert_eq!("q2".parse::<QuantMix>().unwrap(), QuantMix::Q2);
    assert!("q3".parse::<QuantMix>().unwrap_err().contains("q3"));
    let _ = MetaValue::U32(0);
}
