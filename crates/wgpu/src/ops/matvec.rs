//! y = W x (one token) and Y = X W^T (a few tokens) over a resident quantized tensor, one dispatch per
//! binding part.
use std::sync::Arc;

use super::{check_tokens, grid, u32_of};
use crate::buffer::GpuBuffer;
use crate::encoder::Encoder;
use crate::error::WgpuError;
use crate::gpu::Gpu;
use crate::resident::ResidentTensor;
use crate::shaders::{matvec_key, matvec_source, needs_table, F16Unpack, Reduce, BATCH_TILE};

/// One token or a batch of up to `max_tokens` (activation rows, token-major).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Product {
    Vec,
    Batched { max_tokens: u32 },
}

struct Part {
    bind: wgpu::BindGroup,
    wg: (u32, u32),
}

/// A mat-vec / batched product bound to its weights and activation buffers.
pub struct MatVec {
    pipeline: Arc<wgpu::ComputePipeline>,
    parts: Vec<Part>,
    tile: u32,
    max_tokens: u32,
    pub reduce: Reduce,
    pub f16: F16Unpack,
}

impl MatVec {
    /// x holds max_tokens rows of `w.cols` floats, y max_tokens rows of `w.rows` floats.
    pub fn new(gpu: &Gpu, w: &ResidentTensor, x: &GpuBuffer, y: &GpuBuffer, kind: Product) -> Result<Self, WgpuError> {
        let (tile, max_tokens) = match kind {
            Product::Vec => (1, 1),
            Product::Batched { max_tokens } => (BATCH_TILE, max_tokens.max(1)),
        };
        if !w.cols.is_multiple_of(8) {
            return Err(WgpuError::BadShape { what: w.name.clone(), reason: format!("{} columns: the kernels need a multiple of 8", w.cols) });
        }
        let m = max_tokens as usize;
        if x.len() < m * w.cols || y.len() < m * w.rows {
            return Err(WgpuError::BadShape {
                what: w.name.clone(),
                reason: format!("activations hold {} / {} floats, need {} x {} / {} x {}", x.len(), y.len(), m, w.cols, m, w.rows),
            });
        }
        let reduce = if gpu.caps().subgroup { Reduce::Subgroup } else { Reduce::Tree };
        let f16 = if gpu.caps().f16_in_f32 { F16Unpack::Native } else { F16Unpack::Bits };
        let ty = w.ty;
        let key = matvec_key(ty, tile, reduce, f16);
        let pipeline = gpu.pipeline(&key, || {
            matvec_source(ty, tile, reduce, f16).ok_or_else(|| WgpuError::BadShape { what: key.clone(), reason: format!("no mat-vec kernel for {}", ty.name()) })
        })?;
        let cols = u32_of("columns", w.cols)?;
        let row_bytes = u32_of("row bytes", w.row_bytes)?;
        let y_stride = u32_of("rows", w.rows)?;
        let table = if needs_table(ty) { Some(gpu.iq2_grid()?) } else { None };
        let mut parts = Vec::with_capacity(w.parts.len());
        for (i, part) in w.parts.iter().enumerate() {
            let rows = u32_of("rows", part.rows)?;
            let wg = grid(rows);
            let params: [u32; 8] = [rows, cols, row_bytes, u32_of("row", part.row0)?, wg.0, cols / 4, y_stride, part.byte_offset];
            let label = format!("{}#{i}", w.name);
            let uni = gpu.uniform(&label, bytemuck::cast_slice(&params))?;
            let mut buffers = vec![&part.buffer, &x.buffer, &y.buffer, &uni, &gpu.step];
            if let Some(t) = table.as_deref() {
                buffers.push(t);
            }
            let bind = gpu.bind_group(&label, &pipeline, &buffers)?;
            parts.push(Part { bind, wg });
        }
        Ok(Self { pipeline, parts, tile, max_tokens, reduce, f16 })
    }

    /// Records the product for the step's tokens (1 for `Product::Vec`).
    pub fn encode(&self, enc: &mut Encoder) -> Result<(), WgpuError> {
        let ntok = if self.tile == 1 { 1 } else { enc.step().ntok };
        check_tokens("mat-vec", ntok, self.max_tokens)?;
        let tiles = ntok.div_ceil(self.tile);
        let pass = enc.pass();
        pass.set_pipeline(&self.pipeline);
        for p in &self.parts {
            pass.set_bind_group(0, &p.bind, &[]);
            pass.dispatch_workgroups(p.wg.0, p.wg.1, tiles);
        }
        Ok(())
    }
}
