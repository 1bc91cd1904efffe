//! A KV cache file (`--kv-load`, the server's disk cache) of arbitrary bytes, read against the KV
//! layout of a small model: a clear error or a state, never a panic or an allocation beyond the file.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let cfg = ds4_model::synth::shape("tiny").unwrap();
    let mut kv = ds4_model::KvState::new(&cfg, ds4_model::LayerRange::full(&cfg), 256);
    let mut logits = Vec::new();
    let model = [7u8; 32];
    let mut r = std::io::Cursor::new(data);
    let _ = ds4_kvstore::format::decode_from(&mut r, data.len() as u64, &model, &mut kv, &mut logits, Some(64));
    let mut r = std::io::Cursor::new(data);
    let _ = ds4_kvstore::format::read_front(&mut r, data.len() as u64, &model);
});
