//! Model identity: what a worker proves it runs. `model_id` hashes the metadata (without the
//! `ds4.shard.*` keys, so every shard of one model agrees); `table_id` hashes the tensor table of
//! one layer range (name, type, dims), so a different quantization or shape of the same range differs;
//! `weights_id` samples the bytes of those tensors, so other weights with the same table differ too.
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

/// The tensors `range` owns (layer tensors of the range, the embedding when it starts at 0 and the
/// other global tensors (head) when it owns the output), by name. None when the file lacks a tensor
/// of some owned layer (then it cannot vouch for that range) or the range is not one of this file's.
fn owned(f: &GgufFile, range: LayerRange) -> Option<Vec<&ds4_gguf::TensorInfo>> {
    if range.first > range.last {
        return None;
    }
    let mut rows = Vec::new();
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
            rows.push(t);
        }
    }
    if seen.iter().any(|s| !s) {
        return None;
    }
    rows.sort_by(|a, b| a.name.cmp(&b.name));
    Some(rows)
}

/// Tensor table hash of `range` (name, type, dims of the tensors it owns); None when the file lacks
/// a tensor of some owned layer.
pub fn table_id(f: &GgufFile, range: LayerRange) -> Option<Digest32> {
    let rows = owned(f, range)?;
    let mut h = Sha256::new();
    h.update(b"ds4-table-id-v1");
    for t in rows {
        h.update((t.name.len() as u64).to_le_bytes());
        h.update(t.name.as_bytes());
        h.update((t.ty as u32).to_le_bytes());
        h.update((t.dims.len() as u64).to_le_bytes());
        for d in &t.dims {
            h.update(d.to_le_bytes());
        }
    }
    Some(h.finalize().into())
}

/// Bytes read per sample of a tensor in [`weights_id`].
const SAMPLE: usize = 4096;

/// Fingerprint of the weights of `range`: per owned tensor (by name) its byte length and three
/// samples of [`SAMPLE`] bytes (start, middle, end; the whole tensor when smaller). Two files with
/// the same metadata and tensor table but other weights (another fine-tune, another quantization
/// run of the same types, a different seed) differ here; reading it costs about 12 KiB per tensor
/// (~12 MiB for a Flash-sized range), not a pass over the file. None as for [`table_id`].
pub fn weights_id(f: &GgufFile, range: LayerRange) -> Option<Digest32> {
    let rows = owned(f, range)?;
    let mut h = Sha256::new();
    h.update(b"ds4-weights-id-v1");
    for t in rows {
        let d = f.tensor_data(t);
        h.update((t.name.len() as u64).to_le_bytes());
        h.update(t.name.as_bytes());
        h.update((d.len() as u64).to_le_bytes());
        if d.len() <= 3 * SAMPLE {
            h.update(d);
        } else {
            let mid = (d.len() / 2 - SAMPLE / 2) & !(SAMPLE - 1);
            h.update(&d[..SAMPLE]);
            h.update(&d[mid..mid + SAMPLE]);
            h.update(&d[d.len() - SAMPLE..]);
        }
    }
    Some(h.finalize().into())
}

pub fn short(d: &Digest32) -> String { d[..6].iter().map(|b| format!("{b:02x}")).collect() }
