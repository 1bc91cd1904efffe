//! Q8_0 products against int8 activations, the CPU's `Precision::Fast` path on the GPU: activation
//! rows quantized to Q8_0 blocks as `ds4_quant::quantize_row_q8_0` makes them (`QuantizeQ8`), then
//! each block's integer dot by `dot4I8Packed` (`MatVecI8`); and the routed experts' IQ2_XXS products
//! against Q8_K rows (`ActBlocks::Q8_K`, `ExpertMatVecI8`). Building blocks measured against the f32
//! activation products (`MatVec`, `ExpertMatVec`) in `wgpu_kernel_bench`; not yet taken by the stage.
use std::sync::Arc;

use super::{check_tokens, grid, u32_of};
use crate::buffer::GpuBuffer;
use crate::encoder::Encoder;
use crate::error::WgpuError;
use crate::gpu::Gpu;
use crate::resident::ResidentTensor;
use crate::shaders::{expert_i8_key, expert_i8_source, expert_shape, matvec_i8_key, matvec_i8_source, matvec_shape, quantize_source, F16Unpack, MatVecShape};
use ds4_quant::GgmlType;

fn bad(what: &str, reason: String) -> WgpuError {
    WgpuError::BadShape { what: what.into(), reason }
}

/// The activation blocks a quantizer writes: Q8_0 (32 values, f16-rounded scale, as
/// `ds4_quant::quantize_row_q8_0`) or Q8_K (256 values, f32 scale, as `quantize_row_q8_k`, no bsums).
#[allow(non_camel_case_types)] // the GGUF type names
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ActBlocks {
    Q8_0,
    Q8_K,
}

impl ActBlocks {
    fn values(self) -> usize {
        match self {
            Self::Q8_0 => 32,
            Self::Q8_K => 256,
        }
    }
}

/// `xq` (packed signed bytes, cols / 4 words a row) and `xd` (one scale a block) from max_tokens
/// activation rows of `cols` floats in `x` (rows `x_stride` floats apart).
pub struct QuantizeQ8 {
    pipeline: Arc<wgpu::ComputePipeline>,
    bind: wgpu::BindGroup,
    /// Workgroups along x: a Q8_0 thread or a Q8_K workgroup takes a block.
    groups: u32,
    max_tokens: u32,
}

impl QuantizeQ8 {
    #[allow(clippy::too_many_arguments)]
    pub fn new(gpu: &Gpu, kind: ActBlocks, x: &GpuBuffer, x_stride: usize, xq: &GpuBuffer, xd: &GpuBuffer, cols: usize, max_tokens: u32) -> Result<Self, WgpuError> {
        let (m, bv, what) = (max_tokens as usize, kind.values(), format!("{kind:?} quantize"));
        if cols == 0 || !cols.is_multiple_of(bv) || x_stride < cols || max_tokens == 0 {
            return Err(bad(&what, format!("{cols} columns (a multiple of {bv}), rows of {x_stride}, {max_tokens} tokens")));
        }
        if x.len() < (m - 1) * x_stride + cols || xq.len() < m * cols / 4 || xd.len() < m * cols / bv {
            return Err(bad(&what, format!("buffers too small for {m} rows of {cols}")));
        }
        let k_blocks = kind == ActBlocks::Q8_K;
        let pipeline = gpu.pipeline(if k_blocks { "quantize_q8_k" } else { "quantize_q8_0" }, || Ok(quantize_source(k_blocks)))?;
        let params: [u32; 4] = [u32_of("columns", cols)?, u32_of("row stride", x_stride)?, 0, 0];
        let uni = gpu.uniform(&what, bytemuck::cast_slice(&params))?;
        let bind = gpu.bind_group(&what, &pipeline, &[&x.buffer, &xq.buffer, &xd.buffer, &uni, &gpu.step])?;
        let blocks = u32_of("blocks", cols / bv)?;
        Ok(Self { pipeline, bind, groups: if k_blocks { blocks } else { blocks.div_ceil(64) }, max_tokens })
    }

    pub fn encode(&self, enc: &mut Encoder) -> Result<(), WgpuError> {
        let ntok = enc.step().ntok;
        check_tokens("activation quantize", ntok, self.max_tokens)?;
        let pass = enc.pass();
        pass.set_pipeline(&self.pipeline);
        pass.set_bind_group(0, &self.bind, &[]);
        pass.dispatch_workgroups(self.groups, ntok.max(1), 1);
        Ok(())
    }
}

struct Part {
    bind: wgpu::BindGroup,
    wg: (u32, u32),
}

/// y = W x for one token: Q8_0 `w` against the Q8_0 activation row (`xq`, `xd`) of `QuantizeQ8`.
pub struct MatVecI8 {
    pipeline: Arc<wgpu::ComputePipeline>,
    parts: Vec<Part>,
    pub shape: MatVecShape,
}

impl MatVecI8 {
    pub fn new(gpu: &Gpu, w: &ResidentTensor, xq: &GpuBuffer, xd: &GpuBuffer, y: &GpuBuffer) -> Result<Self, WgpuError> {
        Self::with_shape(gpu, w, xq, xd, y, matvec_shape(w.ty, w.rows, w.cols))
    }

    /// As `new`, with the workgroup shape given (benchmarks compare shapes).
    pub fn with_shape(gpu: &Gpu, w: &ResidentTensor, xq: &GpuBuffer, xd: &GpuBuffer, y: &GpuBuffer, shape: MatVecShape) -> Result<Self, WgpuError> {
        if w.ty != GgmlType::Q8_0 || !w.cols.is_multiple_of(32) {
            return Err(bad(&w.name, format!("{} x {} {}: the int8 mat-vec takes Q8_0", w.rows, w.cols, w.ty.name())));
        }
        if xq.len() < w.cols / 4 || xd.len() < w.cols / 32 || y.len() < w.rows {
            return Err(bad(&w.name, "activation or output buffers too small".into()));
        }
        let f16 = if gpu.caps().f16_in_f32 { F16Unpack::Native } else { F16Unpack::Bits };
        let key = matvec_i8_key(shape, f16);
        let pipeline = gpu.pipeline(&key, || Ok(matvec_i8_source(shape, f16)))?;
        let (cols, row_bytes) = (u32_of("columns", w.cols)?, u32_of("row bytes", w.row_bytes)?);
        let mut parts = Vec::with_capacity(w.parts.len());
        for (i, part) in w.parts.iter().enumerate() {
            let rows = u32_of("rows", part.rows)?;
            let wg = grid(rows.div_ceil(shape.rows()));
            // The mat-vec `Params` layout.
            let params: [u32; 12] = [rows, cols, row_bytes, u32_of("row", part.row0)?, wg.0, cols / 4, 0, u32_of("weight offset", part.byte_offset as usize)?, 0, 0, 0, 0];
            let label = format!("{} i8#{i}", w.name);
            let uni = gpu.uniform(&label, bytemuck::cast_slice(&params))?;
            parts.push(Part { bind: gpu.bind_group(&label, &pipeline, &[&part.buffer, &xq.buffer, &y.buffer, &uni, &gpu.step, &xd.buffer])?, wg });
        }
        Ok(Self { pipeline, parts, shape })
    }

    pub fn encode(&self, enc: &mut Encoder) -> Result<(), WgpuError> {
        check_tokens("int8 mat-vec", enc.step().ntok, 1)?;
        let pass = enc.pass();
        pass.set_pipeline(&self.pipeline);
        for p in &self.parts {
            pass.set_bind_group(0, &p.bind, &[]);
            pass.dispatch_workgroups(p.wg.0, p.wg.1, 1);
        }
        Ok(())
    }
}

/// The routed experts' IQ2_XXS products of one token against its Q8_K row (`QuantizeQ8`, `ActBlocks::Q8_K`):
/// y[slot] = W_{ids[slot]} . x for the k slots, over a stacked expert tensor (an expert may straddle
/// binding parts: one dispatch per part), as `ExpertMatVec::new` for gate / up.
pub struct ExpertMatVecI8 {
    pipeline: Arc<wgpu::ComputePipeline>,
    parts: Vec<Part>,
    k: u32,
    pub shape: MatVecShape,
}

impl ExpertMatVecI8 {
    #[allow(clippy::too_many_arguments)]
    pub fn new(gpu: &Gpu, w: &ResidentTensor, n_expert: usize, ids: &GpuBuffer, xq: &GpuBuffer, xd: &GpuBuffer, y: &GpuBuffer, k: usize) -> Result<Self, WgpuError> {
        if w.ty != GgmlType::IQ2_XXS || !w.cols.is_multiple_of(256) || n_expert == 0 || !w.rows.is_multiple_of(n_expert) || k == 0 {
            return Err(bad(&w.name, format!("{} x {} {} over {n_expert} experts: the int8 expert product takes IQ2_XXS", w.rows, w.cols, w.ty.name())));
        }
        let r = w.rows / n_expert;
        if xq.len() < w.cols / 4 || xd.len() < w.cols / 256 || y.len() < k * r || ids.len() < k {
            return Err(bad(&w.name, "activation, id or output buffers too small".into()));
        }
        let f16 = if gpu.caps().f16_in_f32 { F16Unpack::Native } else { F16Unpack::Bits };
        let shape = expert_shape(w.ty, r, w.cols, k);
        let key = expert_i8_key(shape, f16);
        let pipeline = gpu.pipeline(&key, || Ok(expert_i8_source(shape, f16)))?;
        let table = gpu.iq2_grid()?;
        let exp: [u32; 4] = [u32_of("slots", k)?, u32_of("slots", k)?, u32_of("rows per expert", r)?, 0];
        let ex_uni = gpu.uniform(&format!("{} i8 experts", w.name), bytemuck::cast_slice(&exp))?;
        let (cols, row_bytes) = (u32_of("columns", w.cols)?, u32_of("row bytes", w.row_bytes)?);
        let wg = grid(u32_of("rows per expert", r)?.div_ceil(shape.rows()));
        let mut parts = Vec::with_capacity(w.parts.len());
        for (i, part) in w.parts.iter().enumerate() {
            let params: [u32; 12] = [u32_of("rows", part.rows)?, cols, row_bytes, u32_of("row", part.row0)?, wg.0, cols / 4, u32_of("rows", r)?, part.byte_offset, 0, 0, 0, 0];
            let label = format!("{} i8#{i}", w.name);
            let uni = gpu.uniform(&label, bytemuck::cast_slice(&params))?;
            let bind = gpu.bind_group(&label, &pipeline, &[&part.buffer, &xq.buffer, &y.buffer, &uni, &gpu.step, &ex_uni, &ids.buffer, &xd.buffer, &table])?;
            parts.push(Part { bind, wg });
        }
        Ok(Self { pipeline, parts, k: u32_of("slots", k)?, shape })
    }

    pub fn encode(&self, enc: &mut Encoder) -> Result<(), WgpuError> {
        check_tokens("int8 expert product", enc.step().ntok, 1)?;
        let pass = enc.pass();
        pass.set_pipeline(&self.pipeline);
        for p in &self.parts {
            pass.set_bind_group(0, &p.bind, &[]);
            pass.dispatch_workgroups(p.wg.0, p.wg.1, self.k);
        }
        Ok(())
    }
}
