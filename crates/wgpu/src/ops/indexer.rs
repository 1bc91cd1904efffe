//! Indexer of ratio-4 layers: relevance scores of the compressed indexer rows for every token that
//! sees more than top_k of them, and the top_k row ids per such token
//! (`ds4_model::attention::{indexer_scores, top_k_indices}` as the stage calls them).
use std::sync::Arc;

use super::{check_tokens, u32_of};
use crate::buffer::GpuBuffer;
use crate::encoder::Encoder;
use crate::error::WgpuError;
use crate::gpu::Gpu;
use crate::shaders::{INDEXER_SCORES, TOP_K};

/// The widest indexer head the score kernel stages in workgroup memory.
pub const INDEXER_MAX_DIM: usize = 256;
/// Most indexer heads (the scores kernel keeps each candidate's head terms in workgroup memory).
pub const INDEXER_MAX_HEADS: usize = 128;
/// Candidates a workgroup of the scores kernel takes (`CW` in indexer_scores.wgsl).
const SCORE_CANDIDATES: u32 = 16;

#[derive(Debug, Clone, Copy)]
pub struct IndexerShape {
    pub heads: usize,
    pub dim: usize,
    pub ratio: usize,
    pub top_k: usize,
    /// Rows of the indexer-row buffer (`ds4_model::kv::compressed_capacity`).
    pub capacity: usize,
    pub max_tokens: u32,
}

/// The buffers of one layer's indexer.
pub struct IndexerBuffers<'a> {
    /// max_tokens x heads x dim: the finished (roped, QAT'd) indexer queries.
    pub q: &'a GpuBuffer,
    /// max_tokens x heads: the head weights as projected (scaled by 1/sqrt(dim * heads) here).
    pub w: &'a GpuBuffer,
    /// capacity x dim per KV slot: the finished indexer rows (slot s from row `s * capacity`).
    pub keys: &'a GpuBuffer,
    /// max_tokens x capacity scratch.
    pub scores: &'a GpuBuffer,
    /// max_tokens x top_k output row ids (u32), ascending per token.
    pub sel: &'a GpuBuffer,
}

pub struct Indexer {
    scores: Arc<wgpu::ComputePipeline>,
    scores_bind: wgpu::BindGroup,
    top_k: Arc<wgpu::ComputePipeline>,
    top_k_bind: wgpu::BindGroup,
    shape: IndexerShape,
}

impl Indexer {
    pub fn new(gpu: &Gpu, b: &IndexerBuffers, shape: IndexerShape) -> Result<Self, WgpuError> {
        let IndexerShape { heads, dim, ratio, top_k, capacity, max_tokens } = shape;
        let m = max_tokens.max(1) as usize;
        let ok = heads > 0
            && heads <= INDEXER_MAX_HEADS
            && dim > 0
            && dim <= INDEXER_MAX_DIM
            && dim.is_multiple_of(4)
            && ratio > 0
            && top_k > 0
            && b.q.len() >= m * heads * dim
            && b.w.len() >= m * heads
            && b.keys.len() >= capacity * dim
            && b.scores.len() >= m * capacity
            && b.sel.len() >= m * top_k
            && capacity < 1 << 24;
        if !ok {
            return Err(WgpuError::BadShape { what: "indexer".into(), reason: format!("{heads} heads (at most {INDEXER_MAX_HEADS}) of {dim} (a multiple of 4, at most {INDEXER_MAX_DIM}), ratio {ratio}, top-k {top_k}, {capacity} rows: a zero size or a buffer too small") });
        }
        let wscale = 1.0 / ((dim * heads) as f32).sqrt();
        let sp: [u32; 8] = [u32_of("heads", heads)?, u32_of("dim", dim)?, u32_of("ratio", ratio)?, u32_of("top k", top_k)?, u32_of("capacity", capacity)?, wscale.to_bits(), 0, 0];
        let scores = gpu.pipeline("indexer_scores", || Ok(INDEXER_SCORES.to_string()))?;
        let suni = gpu.uniform("indexer scores", bytemuck::cast_slice(&sp))?;
        let scores_bind = gpu.bind_group("indexer scores", &scores, &[&b.q.buffer, &b.w.buffer, &b.keys.buffer, &b.scores.buffer, &suni, &gpu.step])?;
        let kp: [u32; 4] = [u32_of("ratio", ratio)?, u32_of("top k", top_k)?, u32_of("capacity", capacity)?, 0];
        let top = gpu.pipeline("top_k", || Ok(TOP_K.to_string()))?;
        let kuni = gpu.uniform("top k", bytemuck::cast_slice(&kp))?;
        let top_k_bind = gpu.bind_group("top k", &top, &[&b.scores.buffer, &b.sel.buffer, &kuni, &gpu.step])?;
        Ok(Self { scores, scores_bind, top_k: top, top_k_bind, shape })
    }

    /// Scores and picks for the step's tokens (nothing for tokens with at most top_k rows).
    pub fn encode(&self, enc: &mut Encoder) -> Result<(), WgpuError> {
        let st = enc.step();
        check_tokens("indexer", st.ntok, self.shape.max_tokens)?;
        let end = enc.end().ok_or_else(|| WgpuError::BadShape { what: "indexer".into(), reason: "position overflow".into() })?;
        let nc_max = end as usize / self.shape.ratio;
        if nc_max > self.shape.capacity {
            return Err(WgpuError::BadShape { what: "indexer".into(), reason: format!("{nc_max} rows, capacity {}", self.shape.capacity) });
        }
        if st.ntok == 0 || nc_max <= self.shape.top_k {
            return Ok(());
        }
        let pass = enc.pass();
        pass.set_pipeline(&self.scores);
        pass.set_bind_group(0, &self.scores_bind, &[]);
        pass.dispatch_workgroups((nc_max as u32).div_ceil(SCORE_CANDIDATES), st.ntok, 1);
        pass.set_pipeline(&self.top_k);
        pass.set_bind_group(0, &self.top_k_bind, &[]);
        pass.dispatch_workgroups(st.ntok, 1, 1);
        Ok(())
    }
}
