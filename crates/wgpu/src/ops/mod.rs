//! Device ops. Each is built once at load (pipeline, uniforms, bind groups) over fixed buffers;
//! `encode` only records dispatches.
mod argmax;
mod attention;
mod compressor;
mod indexer;
mod kv_row;
mod matvec;
mod norm;
mod rope;
mod swiglu;

pub use argmax::{Argmax, Pick};
pub use attention::{Attention, AttentionBuffers, AttentionShape, ATTENTION_MAX_HEAD_DIM};
pub use compressor::{Compressor, CompressorShape};
pub use indexer::{Indexer, IndexerBuffers, IndexerShape, INDEXER_MAX_DIM};
pub use kv_row::{KvRow, KvRowSpec, RowNorm, RowPos, RowQat, KV_ROW_MAX_DIM};
pub use matvec::{MatVec, Product};
pub use norm::RmsNorm;
pub use rope::Rope;
pub use swiglu::SwiGlu;

use crate::error::WgpuError;

/// Workgroup grid (x, y) covering `n` workgroups with x <= 65535 (the per-dimension limit).
pub(crate) fn grid(n: u32) -> (u32, u32) {
    let x = n.clamp(1, 65535);
    (x, n.div_ceil(x).max(1))
}

/// A u32 from a size, or a BadShape error naming it.
pub(crate) fn u32_of(what: &str, v: usize) -> Result<u32, WgpuError> {
    u32::try_from(v).map_err(|_| WgpuError::BadShape { what: what.into(), reason: format!("{v} does not fit in 32 bits") })
}

/// Refuses a step with more tokens than the op was built for.
pub(crate) fn check_tokens(op: &str, ntok: u32, max: u32) -> Result<(), WgpuError> {
    if ntok > max {
        return Err(WgpuError::BadShape { what: op.into(), reason: format!("{ntok} tokens in a step, built for at most {max}") });
    }
    Ok(())
}
