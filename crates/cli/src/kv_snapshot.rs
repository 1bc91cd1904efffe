//! The size of a session snapshot at a context frontier, as ds4-bench reports it in `kvcache_bytes`:
//! what a snapshot of the session holds at that point (not the allocation), in ds4's payload layout
//! (ds4-features.md §5.8): a 13×u32 header, the token ids, the next-token logits, two row counts per
//! layer, then per layer the live raw window rows, the compressed rows and the compressor frontier,
//! and on ratio-4 layers the indexer rows and the indexer frontier. Same on every backend, because it
//! is computed from the model shape and the frontier rather than read from host memory (a GPU backend
//! keeps the KV on the device).
use ds4_model::kv::compressor_rows;
use ds4_model::Config;

const F32: u64 = 4;

/// Snapshot bytes of a session holding `n` tokens.
pub fn snapshot_bytes(cfg: &Config, n: usize) -> u64 {
    let n = n as u64;
    let header = 13 * 4 + cfg.n_layer as u64 * 2 * 4;
    let tokens_and_logits = n * 4 + cfg.n_vocab as u64 * F32;
    let layers: u64 = (0..cfg.n_layer).map(|il| layer_bytes(cfg, il, n)).sum();
    header + tokens_and_logits + layers
}

fn layer_bytes(cfg: &Config, il: usize, n: u64) -> u64 {
    let d = cfg.head_dim as u64;
    let raw = n.min(cfg.swa as u64) * d * F32;
    let ratio = cfg.ratio(il);
    if ratio == 0 {
        return raw;
    }
    let rows = n / ratio as u64;
    // A compressor keeps kv and score candidates for `compressor_rows` positions of `coff·width` channels.
    let frontier = |width: u64| compressor_rows(ratio) as u64 * cfg.compress_coff(il) as u64 * width * 2 * F32;
    let mut b = raw + rows * d * F32 + frontier(d);
    if ratio == 4 {
        let w = cfg.idx_dim as u64;
        b += rows * w * F32 + frontier(w);
    }
    b
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The C engine's published `kvcache_bytes` for DeepSeek V4 Flash (ds4 speed-bench/m4_max.csv).
    #[test]
    fn matches_ds4_flash_numbers() {
        let flash = ds4_model::synth::shape("flash").unwrap();
        assert_eq!(snapshot_bytes(&flash, 2048), 52_184_460);
        assert_eq!(snapshot_bytes(&flash, 65536), 926_033_292);
    }
}
