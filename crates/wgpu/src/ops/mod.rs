//! Device ops. Each is built once at load (pipeline, uniforms, bind groups) over fixed buffers;
//! `encode` only records dispatches.
mod argmax;
mod attention;
mod compressor;
mod indexer;
mod kv_row;
mod embed;
mod hc;
mod matvec;
mod matvec_i8;
mod moe;
mod norm;
mod rope;
mod router;
mod steer;
mod step_matvec;
mod swiglu;

pub use argmax::{Argmax, Pick};
pub use attention::{max_candidates, split_floats, Attention, AttentionBuffers, AttentionShape, ATTENTION_MAX_HEAD_DIM};
pub use compressor::{Compressor, CompressorShape, UNDO_ROWS};
pub use indexer::{Indexer, IndexerBuffers, IndexerShape, INDEXER_MAX_DIM};
pub use kv_row::{KvRow, KvRowSpec, RowNorm, RowPos, RowQat, KV_ROW_MAX_DIM};
pub use embed::Embed;
pub use hc::{HcDims, HcHead, HcPost, HcPre, HeadRows, MAX_HC};
pub use matvec::{MatVec, Product};
pub use matvec_i8::{ActBlocks, ExpertMatVecI8, MatVecI8, QuantizeQ8};
pub use moe::{ExpertGroups, ExpertMatVec, Experts, Moe, MoeScratch};
pub use norm::RmsNorm;
pub use rope::Rope;
pub use router::{RouteConfig, Router, Routing, MAX_EXPERTS, MAX_EXPERTS_PER_TOKEN};
pub use steer::{Steer, SteerSite, SteerTables};
pub use step_matvec::StepMatVec;
pub use swiglu::SwiGlu;

use crate::counters::Counters;
use crate::error::WgpuError;
use crate::gpu::Gpu;

/// A small constant table (norm weights, HC scale/base, routing bias) uploaded once at load.
pub(crate) fn upload_f32(gpu: &Gpu, label: &str, data: &[f32]) -> Result<wgpu::Buffer, WgpuError> {
    upload_words(gpu, label, bytemuck::cast_slice(data))
}

/// A small u32 table (the hash routing table) uploaded once at load.
pub(crate) fn upload_u32(gpu: &Gpu, label: &str, data: &[u32]) -> Result<wgpu::Buffer, WgpuError> {
    upload_words(gpu, label, bytemuck::cast_slice(data))
}

fn upload_words(gpu: &Gpu, label: &str, bytes: &[u8]) -> Result<wgpu::Buffer, WgpuError> {
    gpu.check_binding(label, bytes.len() as u64)?;
    let b = gpu.buffer_with(label, bytes, bytes.len() as u64, wgpu::BufferUsages::STORAGE)?;
    Counters::add(&gpu.counters.weight_uploads, 1);
    Counters::add(&gpu.counters.weight_bytes, bytes.len() as u64);
    Ok(b)
}

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
