//! y = W x (one token) and Y = X W^T (a few tokens) over a resident quantized tensor, one dispatch per
//! binding part: the mat-vec kernel (a decode row and a short step's rows sum alike, bit for bit), or
//! for steps of `MATMUL_MIN_TOKENS` tokens and more (prefill) the tiled product (64 x 64 tiles).
use std::sync::Arc;

use super::{check_tokens, grid, u32_of};
use crate::buffer::GpuBuffer;
use crate::encoder::Encoder;
use crate::error::WgpuError;
use crate::gpu::Gpu;
use crate::resident::ResidentTensor;
use crate::shaders::{matmul_coop_key, matmul_coop_source, matmul_key, matmul_source, MATMUL_COOP_SHARED_BYTES, matvec_key, matvec_shape, matvec_source, needs_table, F16Unpack, MatVecShape, BATCH_TILE, MATMUL_MIN_TOKENS, MATMUL_SHARED_BYTES, MATMUL_TILE};

/// Whether the adapter's workgroup memory holds the tiled products' tiles.
pub(crate) fn tiled_products_fit(gpu: &Gpu) -> bool {
    gpu.workgroup_memory() >= MATMUL_SHARED_BYTES as u64
}

/// Columns from which a dense tiled product takes the coop tile. On an H100 (kernel_bench, 4096
/// tokens) the coop tile ran 1.3-1.8x the f32 tile at 4096 and 8192 columns but 0.7x at q_b's 1024
/// (32768 rows), likely its fixed cost per workgroup (zeroed and staged outputs) over few column steps.
pub(crate) const COOP_MIN_COLS: usize = 2048;

/// The side of the cooperative matrices the tiled products use on this device, if any: the coop
/// tile needs them, 8 subgroups of 32 in its 256 threads, and room for its f32 output tile.
pub(crate) fn coop_tile_side(gpu: &Gpu) -> Option<u32> {
    let c = gpu.caps();
    let fits = gpu.workgroup_memory() >= MATMUL_COOP_SHARED_BYTES as u64;
    c.coop.filter(|_| fits && c.subgroup_min_size == 32 && c.subgroup_max_size == 32)
}

/// One token or a batch of up to `max_tokens` (activation rows, token-major).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Product {
    Vec,
    Batched { max_tokens: u32 },
}

/// How rows take their inputs: row r reads `[r / rows * cols, ...)` of activation rows of `x_stride`.
struct Groups {
    rows: usize,
    x_stride: usize,
}

struct Part {
    bind: wgpu::BindGroup,
    wg: (u32, u32),
}

/// A mat-vec / batched product bound to its weights and activation buffers.
pub struct MatVec {
    pipeline: Arc<wgpu::ComputePipeline>,
    parts: Vec<Part>,
    /// The tiled product a batched step of at least `MATMUL_MIN_TOKENS` tokens takes (prefill), with
    /// its per-part bindings; None for one-token products (or groups that do not tile by 64 rows).
    matmul: Option<(Arc<wgpu::ComputePipeline>, Vec<Part>)>,
    tile: u32,
    max_tokens: u32,
    pub shape: MatVecShape,
    pub f16: F16Unpack,
}

impl MatVec {
    /// x holds max_tokens rows of `w.cols` floats, y max_tokens rows of `w.rows` floats.
    pub fn new(gpu: &Gpu, w: &ResidentTensor, x: &GpuBuffer, y: &GpuBuffer, kind: Product) -> Result<Self, WgpuError> {
        Self::with_shape(gpu, w, x, y, kind, matvec_shape(w.ty, w.rows, w.cols))
    }

    /// As `new`, with the workgroup shape given (benchmarks and tests compare shapes).
    pub fn with_shape(gpu: &Gpu, w: &ResidentTensor, x: &GpuBuffer, y: &GpuBuffer, kind: Product, shape: MatVecShape) -> Result<Self, WgpuError> {
        Self::build(gpu, w, x, y, kind, Groups { rows: w.rows.max(1), x_stride: w.cols }, shape)
    }

    /// A grouped product (the attention's low-rank output `attn_output_a`): rows
    /// `[g * group_rows, (g + 1) * group_rows)` of `w` take inputs `[g * w.cols, (g + 1) * w.cols)` of
    /// each activation row of `x_stride` floats (groups x w.cols); y holds rows of `w.rows`.
    pub fn grouped(gpu: &Gpu, w: &ResidentTensor, x: &GpuBuffer, y: &GpuBuffer, kind: Product, group_rows: usize, x_stride: usize) -> Result<Self, WgpuError> {
        Self::grouped_with_shape(gpu, w, x, y, kind, group_rows, x_stride, matvec_shape(w.ty, w.rows, w.cols))
    }

    /// As `grouped`, with the workgroup shape given (tests take every rows-per-thread).
    #[allow(clippy::too_many_arguments)]
    pub fn grouped_with_shape(gpu: &Gpu, w: &ResidentTensor, x: &GpuBuffer, y: &GpuBuffer, kind: Product, group_rows: usize, x_stride: usize, shape: MatVecShape) -> Result<Self, WgpuError> {
        if group_rows == 0 || !w.rows.is_multiple_of(group_rows) || x_stride < w.rows / group_rows * w.cols || !x_stride.is_multiple_of(4) {
            return Err(WgpuError::BadShape { what: w.name.clone(), reason: format!("{} rows in groups of {group_rows}, {} columns per group, activation rows of {x_stride}", w.rows, w.cols) });
        }
        Self::build(gpu, w, x, y, kind, Groups { rows: group_rows, x_stride }, shape)
    }

    fn build(gpu: &Gpu, w: &ResidentTensor, x: &GpuBuffer, y: &GpuBuffer, kind: Product, groups: Groups, shape: MatVecShape) -> Result<Self, WgpuError> {
        let (tile, max_tokens) = match kind {
            Product::Vec => (1, 1),
            Product::Batched { max_tokens } => (BATCH_TILE, max_tokens.max(1)),
        };
        if !w.cols.is_multiple_of(8) {
            return Err(WgpuError::BadShape { what: w.name.clone(), reason: format!("{} columns: the kernels need a multiple of 8", w.cols) });
        }
        let m = max_tokens as usize;
        if x.len() < m * groups.x_stride || y.len() < m * w.rows {
            return Err(WgpuError::BadShape {
                what: w.name.clone(),
                reason: format!("activations hold {} / {} floats, need {} x {} / {} x {}", x.len(), y.len(), m, groups.x_stride, m, w.rows),
            });
        }
        let f16 = if gpu.caps().f16_in_f32 { F16Unpack::Native } else { F16Unpack::Bits };
        let ty = w.ty;
        let shape = if tile > 1 { shape.batched() } else { shape };
        let key = matvec_key(ty, tile, shape, f16);
        let pipeline = gpu.pipeline(&key, || {
            matvec_source(ty, tile, shape, f16).ok_or_else(|| WgpuError::BadShape { what: key.clone(), reason: format!("no mat-vec kernel for {}", ty.name()) })
        })?;
        let cols = u32_of("columns", w.cols)?;
        let row_bytes = u32_of("row bytes", w.row_bytes)?;
        let y_stride = u32_of("rows", w.rows)?;
        let x_stride4 = u32_of("activation row", groups.x_stride / 4)?;
        let table = if needs_table(ty) { Some(gpu.iq2_grid()?) } else { None };
        // A grouped product's rows find their group's inputs in the kernel: one dispatch per part.
        let (group_rows, group_x4) = if groups.rows < w.rows { (u32_of("group rows", groups.rows)?, u32_of("group inputs", w.cols / 4)?) } else { (0, 0) };
        // One binding per part for `pipeline`, whose workgroups take `per_wg` rows.
        let bind_parts = |pipeline: &wgpu::ComputePipeline, per_wg: u32, label: &str| -> Result<Vec<Part>, WgpuError> {
            let mut parts = Vec::with_capacity(w.parts.len());
            for (i, part) in w.parts.iter().enumerate() {
                let rows = u32_of("rows", part.rows)?;
                let wg = grid(rows.div_ceil(per_wg));
                let w_off = u32_of("weight offset", part.byte_offset as usize)?;
                let params: [u32; 12] = [rows, cols, row_bytes, u32_of("row", part.row0)?, wg.0, x_stride4, y_stride, w_off, 0, group_rows, group_x4, 0];
                let label = format!("{}{label}#{i}", w.name);
                let uni = gpu.uniform(&label, bytemuck::cast_slice(&params))?;
                let mut buffers = vec![&part.buffer, &x.buffer, &y.buffer, &uni, &gpu.step];
                if let Some(t) = table.as_deref() {
                    buffers.push(t);
                }
                parts.push(Part { bind: gpu.bind_group(&label, pipeline, &buffers)?, wg });
            }
            Ok(parts)
        };
        let parts = bind_parts(&pipeline, shape.rows(), "")?;
        let tiles_groups = group_rows == 0 || group_rows % MATMUL_TILE == 0;
        let matmul = if tile > 1 && tiles_groups && tiled_products_fit(gpu) {
            // The module text is built only on a pipeline-cache miss.
            let coop = coop_tile_side(gpu).filter(|_| w.cols >= COOP_MIN_COLS);
            let key = coop.map_or_else(|| matmul_key(ty, f16), |n| matmul_coop_key(ty, f16, n));
            let src = || coop.map_or_else(|| matmul_source(ty, f16), |n| matmul_coop_source(ty, f16, n));
            let mm = gpu.pipeline(&key, || src().ok_or_else(|| WgpuError::BadShape { what: key.clone(), reason: format!("no tiled product for {}", ty.name()) }))?;
            let mparts = bind_parts(&mm, MATMUL_TILE, " tiles")?;
            Some((mm, mparts))
        } else {
            None
        };
        Ok(Self { pipeline, parts, matmul, tile, max_tokens, shape, f16 })
    }

    /// Records the product for the step's tokens (1 for `Product::Vec`).
    pub fn encode(&self, enc: &mut Encoder) -> Result<(), WgpuError> {
        let ntok = if self.tile == 1 { 1 } else { enc.step().ntok };
        check_tokens("mat-vec", ntok, self.max_tokens)?;
        if let Some((mm, parts)) = self.matmul.as_ref().filter(|_| ntok >= MATMUL_MIN_TOKENS) {
            let pass = enc.pass();
            pass.set_pipeline(mm);
            for p in parts {
                pass.set_bind_group(0, &p.bind, &[]);
                pass.dispatch_workgroups(p.wg.0, p.wg.1, ntok.div_ceil(MATMUL_TILE));
            }
            return Ok(());
        }
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
