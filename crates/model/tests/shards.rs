//! Map plans and shard files: coalesced mapping counts, shard == same range of the full file.
mod common;
use common::*;
use ds4_gguf::GgufFile;
use ds4_model::synth::Mix;
use ds4_model::{Config, LayerRange, Logits, Options, Stage, Weights};
use std::path::Path;
use std::sync::Arc;

fn stage(path: &Path, range: &str) -> Stage {
    let f = Arc::new(GgufFile::open(path).unwrap());
    let cfg = Config::from_gguf(&f).unwrap();
    let r = LayerRange::parse(range, cfg.n_layer).unwrap();
    let w = Weights::bind_mapped(f, path, &cfg, r).unwrap();
    Stage::new(cfg, w, Options::default())
}

/// Maximal runs of owned tensors in file order (independent of the map plan code).
fn contiguous_runs(path: &Path, range: &str) -> usize {
    let f = GgufFile::open(path).unwrap();
    let cfg = Config::from_gguf(&f).unwrap();
    let r = LayerRange::parse(range, cfg.n_layer).unwrap();
    let mut t: Vec<_> = f.tensors().iter().collect();
    t.sort_by_key(|t| t.offset);
    let owned: Vec<bool> = t.iter().map(|t| ds4_model::shard::owned_by(&t.name, r)).collect();
    owned.iter().enumerate().filter(|&(i, &o)| o && (i == 0 || !owned[i - 1])).count()
}

#[test]
fn full_file_ranges_map_one_region_per_contiguous_run() {
    let full = tiny_model(Mix::F16, "f16");
    for range in ["0:2", "2:4", "3:output", "0:output", "1:1"] {
        let st = stage(&full, range);
        assert_eq!(st.w.n_mappings(), contiguous_runs(&full, range), "range {range}");
        eprintln!("{}", st.w.plan.describe(range));
    }
}

#[test]
fn shard_is_one_mapping_and_matches_the_full_file() {
    let full = tiny_model(Mix::F16, "f16");
    let dir = full.parent().unwrap();
    let (a, b) = (dir.join("shard-a.gguf"), dir.join("shard-b.gguf"));
    let f = GgufFile::open(&full).unwrap();
    let cfg = Config::from_gguf(&f).unwrap();
    ds4_model::shard::write_shard(&f, LayerRange::parse("0:2", cfg.n_layer).unwrap(), &a).unwrap();
    ds4_model::shard::write_shard(&f, LayerRange::parse("3:output", cfg.n_layer).unwrap(), &b).unwrap();

    let (mut sa, mut sb) = (stage(&a, "0:2"), stage(&b, "3:output"));
    assert_eq!(sa.w.n_mappings(), 1);
    assert_eq!(sb.w.n_mappings(), 1);
    let (mut fa, mut fb, mut whole) = (stage(&full, "0:2"), stage(&full, "3:output"), stage(&full, "0:output"));

    let toks = tokens(150, cfg.n_vocab, 9);
    let (mut ka, mut kb, mut kfa, mut kfb, mut kw) = (sa.new_kv(256), sb.new_kv(256), fa.new_kv(256), fb.new_kv(256), whole.new_kv(256));
    for chunk in toks.chunks(50) {
        let n = chunk.len();
        sa.forward(&mut ka, chunk, None, Logits::None).unwrap();
        fa.forward(&mut kfa, chunk, None, Logits::None).unwrap();
        assert_eq!(sa.hidden(n), fa.hidden(n), "first stage: shard != full file");
        let h = sa.hidden(n).to_vec();
        let ls = sb.forward(&mut kb, chunk, Some(&h), Logits::All).unwrap().to_vec();
        let lf = fb.forward(&mut kfb, chunk, Some(&h), Logits::All).unwrap().to_vec();
        let lw = whole.forward(&mut kw, chunk, None, Logits::All).unwrap().to_vec();
        assert_eq!(ls, lf, "second stage: shard != full file");
        assert_eq!(ls, lw, "two stages != one stage");
    }
}

#[test]
fn shard_refuses_layers_it_does_not_hold() {
    let full = tiny_model(Mix::F16, "f16");
    let p = full.parent().unwrap().join("shard-c.gguf");
    let f = GgufFile::open(&full).unwrap();
    let cfg = Config::from_gguf(&f).unwrap();
    ds4_model::shard::write_shard(&f, LayerRange::parse("1:3", cfg.n_layer).unwrap(), &p).unwrap();
    let f = Arc::new(GgufFile::open(&p).unwrap());
    let err = Weights::bind(f, &cfg, LayerRange::parse("2:output", cfg.n_layer).unwrap()).err().expect("must refuse");
    let msg = err.to_string();
    assert!(msg.contains("shard of layers 1:3") && msg.contains("2:output"), "{msg}");
}

#[test]
fn map_plan_from_the_directory_equals_the_bound_plan_and_reads_no_tensor_data() {
    let full = tiny_model(Mix::F16, "f16");
    let f = GgufFile::open(&full).unwrap();
    let cfg = Config::from_gguf(&f).unwrap();
    for range in ["0:2", "3:output", "0:output"] {
        let r = LayerRange::parse(range, cfg.n_layer).unwrap();
        assert_eq!(Weights::map_plan(&f, &cfg, r).unwrap(), stage(&full, range).w.plan, "range {range}");
    }
    // Corrupt tensor data (a hash-routing table with expert ids out of range): binding reads it and
    // fails, the map plan does not read it and still succeeds.
    let hash = (0..cfg.n_layer).find(|&il| cfg.is_hash_layer(il)).expect("the tiny shape has a hash layer");
    let mut bytes = std::fs::read(&full).unwrap();
    let t = f.tensor(&format!("blk.{hash}.ffn_gate_tid2eid.weight")).unwrap();
    let span = f.tensor_file_range(t);
    bytes[span.start as usize..span.end as usize].fill(0xFF);
    let bad = GgufFile::from_bytes(bytes).unwrap();
    let all = LayerRange::full(&cfg);
    assert!(Weights::bind(Arc::new(GgufFile::from_bytes(std::fs::read(&full).unwrap()).unwrap()), &cfg, all).is_ok());
    let err = Weights::bind(Arc::new(GgufFile::from_bytes(bad.bytes().to_vec()).unwrap()), &cfg, all).err().expect("corrupt table bound");
    assert!(err.to_string().contains("expert id"), "{err}");
    assert_eq!(Weights::map_plan(&bad, &cfg, all).unwrap(), Weights::map_plan(&f, &cfg, all).unwrap());
    // A range outside the model is refused before anything is bound.
    let short = LayerRange { last: cfg.n_layer, ..all };
    assert!(Weights::map_plan(&f, &cfg, short).is_err());
}
