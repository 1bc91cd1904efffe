//! Compressor frontier update on the device (`ds4_model::compressor::push` for the step's tokens):
//! the state (kv and score rows) lives in device buffers owned by the op; closed windows' pooled rows
//! go to the compressed-row buffer, raw (a `KvRow` in `RowPos::Windows` mode then norms, ropes and
//! QATs them, as `push` and the stage do).
use std::sync::Arc;

use super::{check_tokens, u32_of};
use crate::buffer::GpuBuffer;
use crate::encoder::Encoder;
use crate::error::WgpuError;
use crate::gpu::Gpu;
use crate::shaders::COMPRESSOR;

/// Shapes of one compressor (the KV compressor: `d = head_dim`; the indexer's: `d = idx_dim`).
#[derive(Debug, Clone, Copy)]
pub struct CompressorShape {
    pub ratio: usize,
    /// Output row width.
    pub d: usize,
    pub max_tokens: u32,
    /// Rows of the compressed-row buffer (`ds4_model::kv::compressed_capacity`).
    pub capacity: usize,
}

pub struct Compressor {
    pipeline: Arc<wgpu::ComputePipeline>,
    bind: wgpu::BindGroup,
    /// Frontier state (`CompressorState::kv` / `score`): rows x width.
    pub st_kv: GpuBuffer,
    pub st_sc: GpuBuffer,
    shape: CompressorShape,
    width: usize,
}

impl Compressor {
    /// `kv` and `gate` hold max_tokens rows of `coff * d` (the projections), `ape` ratio rows of
    /// `coff * d`, `out` capacity rows of d. Coff is 2 for ratio 4 (overlapping windows), else 1.
    pub fn new(gpu: &Gpu, kv: &GpuBuffer, gate: &GpuBuffer, ape: &GpuBuffer, out: &GpuBuffer, shape: CompressorShape) -> Result<Self, WgpuError> {
        let CompressorShape { ratio, d, max_tokens, capacity } = shape;
        let coff = if ratio == 4 { 2 } else { 1 };
        let width = coff * d;
        let rows = if ratio == 4 { 8 } else { ratio };
        let m = max_tokens.max(1) as usize;
        if ratio < 2 || d == 0 || kv.len() < m * width || gate.len() < m * width || ape.len() < ratio * width || out.len() < capacity * d {
            return Err(WgpuError::BadShape {
                what: "compressor".into(),
                reason: format!("ratio {ratio}, rows of {d}: projections, APE ({} floats) or output ({} floats) too small", ape.len(), out.len()),
            });
        }
        let pipeline = gpu.pipeline("compressor", || Ok(COMPRESSOR.to_string()))?;
        let st_kv = GpuBuffer::new(gpu, "compressor kv state", rows * width)?;
        let st_sc = GpuBuffer::new(gpu, "compressor score state", rows * width)?;
        let params: [u32; 4] = [u32_of("compressor row", d)?, u32_of("compressor width", width)?, u32_of("ratio", ratio)?, 0];
        let uni = gpu.uniform("compressor", bytemuck::cast_slice(&params))?;
        let bind = gpu.bind_group("compressor", &pipeline, &[&kv.buffer, &gate.buffer, &ape.buffer, &st_kv.buffer, &st_sc.buffer, &out.buffer, &uni, &gpu.step])?;
        let op = Self { pipeline, bind, st_kv, st_sc, shape, width };
        op.reset(gpu)?;
        Ok(op)
    }

    /// Empties the frontier (a new sequence): kv 0, scores -inf (`CompressorState::new`).
    pub fn reset(&self, gpu: &Gpu) -> Result<(), WgpuError> {
        let n = self.st_sc.len();
        self.st_kv.write(gpu, &vec![0.0; n])?;
        self.st_sc.write(gpu, &vec![f32::NEG_INFINITY; n])
    }

    /// Width of a state row (`coff * d`).
    pub fn width(&self) -> usize {
        self.width
    }

    pub fn encode(&self, enc: &mut Encoder) -> Result<(), WgpuError> {
        let st = enc.step();
        check_tokens("compressor", st.ntok, self.shape.max_tokens)?;
        let end = st.pos.checked_add(st.ntok).ok_or_else(|| WgpuError::BadShape { what: "compressor".into(), reason: "position overflow".into() })?;
        if (end as usize) / self.shape.ratio > self.shape.capacity {
            return Err(WgpuError::BadShape { what: "compressed rows".into(), reason: format!("{} rows, capacity {}", end as usize / self.shape.ratio, self.shape.capacity) });
        }
        let pass = enc.pass();
        pass.set_pipeline(&self.pipeline);
        pass.set_bind_group(0, &self.bind, &[]);
        pass.dispatch_workgroups((self.shape.d as u32).div_ceil(64), 1, 1);
        Ok(())
    }
}
