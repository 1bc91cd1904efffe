//! Rotary embedding on the tail of each head (adjacent pairs, as `ds4_model::rope::Rope::apply`).
use std::sync::Arc;

use super::{check_tokens, grid, u32_of};
use crate::buffer::GpuBuffer;
use crate::counters::Counters;
use crate::encoder::Encoder;
use crate::error::WgpuError;
use crate::gpu::Gpu;
use crate::shaders::ROPE;

pub struct Rope {
    pipeline: Arc<wgpu::ComputePipeline>,
    bind: wgpu::BindGroup,
    per_tok: u32,
    max_tokens: u32,
}

/// `t` (>= 0) as 4 f32 pieces of at most 12 significant bits each, summing to t within t * 2^-48.
pub fn split_turns(t: f64) -> [f32; 4] {
    let mut rest = t;
    let mut out = [0f32; 4];
    for o in &mut out {
        if rest <= 0.0 {
            break;
        }
        // Keep the 12 leading bits of `rest`: exact in f32 and in the f64 subtraction.
        let e = rest.log2().floor() as i32;
        let unit = (2f64).powi(e - 11);
        let piece = (rest / unit).floor() * unit;
        *o = piece as f32;
        rest -= piece;
    }
    out
}

impl Rope {
    /// `x` holds up to max_tokens x n_head x head_dim floats; `freqs` (per pair, radians per position)
    /// rotate the last 2 * freqs.len() values of each head; `inverse` turns the other way.
    pub fn new(gpu: &Gpu, x: &GpuBuffer, n_head: usize, head_dim: usize, freqs: &[f64], inverse: bool, max_tokens: u32) -> Result<Self, WgpuError> {
        if freqs.is_empty() || 2 * freqs.len() > head_dim || x.len() < n_head * head_dim * max_tokens as usize || freqs.iter().any(|f| !f.is_finite() || *f < 0.0) {
            return Err(WgpuError::BadShape { what: "rope".into(), reason: format!("{} pairs in heads of {head_dim}, or a buffer too small, or a bad frequency", freqs.len()) });
        }
        let pipeline = gpu.pipeline("rope", || Ok(ROPE.to_string()))?;
        let table: Vec<f32> = freqs.iter().flat_map(|f| split_turns(f / std::f64::consts::TAU)).collect();
        let bytes: &[u8] = bytemuck::cast_slice(&table);
        let turns = gpu.buffer_with("rope turns", bytes, bytes.len() as u64, wgpu::BufferUsages::STORAGE)?;
        Counters::add(&gpu.counters.weight_uploads, 1);
        Counters::add(&gpu.counters.weight_bytes, bytes.len() as u64);
        let params: [u32; 4] = [u32_of("heads", n_head)?, u32_of("head dim", head_dim)?, u32_of("pairs", freqs.len())?, inverse as u32];
        let uni = gpu.uniform("rope", bytemuck::cast_slice(&params))?;
        let bind = gpu.bind_group("rope", &pipeline, &[&x.buffer, &turns, &uni, &gpu.step])?;
        Ok(Self { pipeline, bind, per_tok: u32_of("rope size", n_head * freqs.len())?, max_tokens })
    }

    pub fn encode(&self, enc: &mut Encoder) -> Result<(), WgpuError> {
        let ntok = enc.step().ntok;
        check_tokens("rope", ntok, self.max_tokens)?;
        if enc.end().is_none_or(|end| end > 1 << 24) {
            return Err(WgpuError::BadShape { what: "rope".into(), reason: "positions must stay below 2^24".into() });
        }
        let (x, y) = grid((self.per_tok * ntok).div_ceil(64));
        let pass = enc.pass();
        pass.set_pipeline(&self.pipeline);
        pass.set_bind_group(0, &self.bind, &[]);
        pass.dispatch_workgroups(x, y, 1);
        Ok(())
    }
}
