//! Shard files: a GGUF holding only a layer range (plus the embedding / head it implies), with the range
//! recorded in metadata so a loader can check `--layers` against it.
use crate::error::{ModelError, Result};
use crate::weights::LayerRange;
use ds4_gguf::{GgufFile, GgufWriter, MetaValue};
use std::path::Path;

/// Which stage part a tensor belongs to, by its ds4 name.
pub fn owned_by(name: &str, r: LayerRange) -> bool {
    if let Some(rest) = name.strip_prefix("blk.") {
        return rest.split('.').next().and_then(|n| n.parse::<usize>().ok()).is_some_and(|il| r.contains(il));
    }
    if name.starts_with("token_embd.") {
        return r.embed;
    }
    if name.starts_with("output") {
        return r.head;
    }
    false
}

/// Writes the shard; returns (tensors written, tensor bytes).
pub fn write_shard(f: &GgufFile, r: LayerRange, out: &Path) -> Result<(usize, u64)> {
    let mut w = GgufWriter::new();
    for (k, v) in f.metadata() {
        if k.starts_with("ds4.shard.") || k == "general.alignment" {
            continue;
        }
        w.add_kv(k, v.clone());
    }
    w.set_alignment(f.alignment());
    w.add_kv("ds4.shard.first_layer", MetaValue::U32(r.first as u32));
    w.add_kv("ds4.shard.last_layer", MetaValue::U32(r.last as u32));
    w.add_kv("ds4.shard.has_embedding", MetaValue::Bool(r.embed));
    w.add_kv("ds4.shard.has_output", MetaValue::Bool(r.head));
    let owned: Vec<_> = f.tensors().iter().filter(|t| owned_by(&t.name, r)).collect();
    if owned.is_empty() {
        return Err(ModelError::Invalid(format!("no tensors belong to layers {}", r.label())));
    }
    for t in &owned {
        w.add_tensor_info(&t.name, t.ty, &t.dims)?;
    }
    let mut s = w.begin(out)?;
    let mut bytes = 0u64;
    for t in &owned {
        let data = f.tensor_data(t);
        for chunk in data.chunks(64 << 20) {
            s.write(chunk)?;
        }
        bytes += data.len() as u64;
    }
    s.finish()?;
    Ok((owned.len(), bytes))
}
