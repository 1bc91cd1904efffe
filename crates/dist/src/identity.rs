//! Model identity: what a worker proves it runs. `model_id` hashes the metadata (without the
//! `ds4.shard.*` keys, so every shard of one model agrees); `table_id` hashes the tensor table of
//! one layer range (name, type, dims), so a different quantization or shape of the same range differs.
use crate::protocol::Digest32;
use ds4_gguf::{GgufFile, MetaValue};
use ds4_model::LayerRange;
use sha2::{Digest, Sha256};

fn hash_value(h: &mut Sha256, v: &MetaValue) {
    h.update((v.meta_type() as u32).to_le_bytes());
    match v.as_array() {
        Some(items) => {
            h.update((items.len() as u64).to_le_bytes());
            for i in items {
                hash_value(h, i);
            }
        }
        None => {
            let s = format!("{v:?}");
            h.update((s.len() as u64).to_le_bytes());
            h.update(s.as_bytes());
        }
    }
}

pub fn model_id(f: &GgufFile) -> Digest32 {
    let mut h = Sha256::new();
    h.update(b"ds4-model-id-v1");
    let mut kv: Vec<&(String, MetaValue)> = f.metadata().iter().filter(|(k, _)| !k.starts_with("ds4.shard.")).collect();
    kv.sort_by(|a, b| a.0.cmp(&b.0));
    for (k, v) in kv {
        h.update((k.len() as u64).to_le_bytes());
        h.update(k.as_bytes());
        hash_value(&mut h, v);
    }
    h.finalize().into()
}

/// Which layer a tensor belongs to (`blk.N.`), None for global tensors.
fn tensor_layer(name: &str) -> Option<usize> {
    name.strip_prefix("blk.")?.split('.').next()?.parse().ok()
}

fn is_embedding(name: &str) -> bool { name.starts_with("token_embd") }

/// Tensor table hash of `range`: layer tensors of the range, the embedding when it starts at 0 and
/// the other global tensors (head) when it owns the output. None when the file lacks a tensor of
/// some owned layer (then it cannot vouch for that range).
pub fn table_id(f: &GgufFile, range: LayerRange) -> Option<Digest32> {
    let mut rows: Vec<(&str, u32, &[u64])> = Vec::new();
    let mut seen = vec![false; range.last - range.first + 1];
    for t in f.tensors() {
        let keep = match tensor_layer(&t.name) {
            Some(l) if range.contains(l) => {
                seen[l - range.first] = true;
                true
            }
            Some(_) => false,
            None if is_embedding(&t.name) => range.embed,
            None => range.head,
        };
        if keep {
            rows.push((t.name.as_str(), t.ty as u32, t.dims.as_slice()));
        }
    }
    if seen.iter().any(|s| !s) {
        return None;
    }
    rows.sort_by(|a, b| a.0.cmp(b.0));
    let mut h = Sha256::new();
    h.update(b"ds4-table-id-v1");
    for (n, ty, dims) in rows {
        h.update((n.len() as u64).to_le_bytes());
        h.update(n.as_bytes());
        h.update(ty.to_le_bytes());
        h.update((dims.len() as u64).to_le_bytes());
        for d in dims {
            h.update(d.to_le_bytes());
        }
    }
    Some(h.finalize().into())
}

pub fn short(d: &Digest32) -> String { d[..6].iter().map(|b| format!("{b:02x}")).collect() }
