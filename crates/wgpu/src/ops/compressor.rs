//! Compressor frontier update on the device (`ds4_model::compressor::push` for the step's tokens,
//! computed in parallel: every window closed in the step is pooled at once from the step's inputs and
//! the frontier as found, then the frontier is advanced): the state (kv and score rows) lives in
//! device buffers owned by the op; closed windows' pooled rows go to the compressed-row buffer, raw (a `KvRow` in `RowPos::Windows` mode then norms, ropes and
//! QATs them, as `push` and the stage do).
use std::sync::Arc;

use super::{check_tokens, u32_of};
use crate::buffer::GpuBuffer;
use crate::encoder::Encoder;
use crate::error::WgpuError;
use crate::gpu::Gpu;
use crate::shaders::{COMPRESSOR_POOL, COMPRESSOR_STATE};

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

/// Most rows of a step whose projections a compressor keeps for an in-place undo (a verify step).
pub const UNDO_ROWS: usize = 8;

pub struct Compressor {
    pool: Arc<wgpu::ComputePipeline>,
    pool_bind: wgpu::BindGroup,
    state: Arc<wgpu::ComputePipeline>,
    state_bind: wgpu::BindGroup,
    /// Frontier state (`CompressorState::kv` / `score`): rows x width per KV slot (slot s from
    /// float `s * slot_len()`).
    pub st_kv: GpuBuffer,
    pub st_sc: GpuBuffer,
    shape: CompressorShape,
    width: usize,
    slots: usize,
    /// The projection buffers the state pass reads (shared work buffers, rewritten by every layer),
    /// and a copy of a journaled step's rows of them (`keep_rows`, `reapply`).
    kv_in: wgpu::Buffer,
    gate_in: wgpu::Buffer,
    undo: (GpuBuffer, GpuBuffer),
}

impl Compressor {
    /// `kv` and `gate` hold max_tokens rows of `coff * d` (the projections), `ape` ratio rows of
    /// `coff * d`, `out` capacity rows of d. Coff is 2 for ratio 4 (overlapping windows), else 1.
    pub fn new(gpu: &Gpu, kv: &GpuBuffer, gate: &GpuBuffer, ape: &GpuBuffer, out: &GpuBuffer, shape: CompressorShape) -> Result<Self, WgpuError> {
        Self::with_slots(gpu, kv, gate, ape, out, shape, 1)
    }

    /// As `new` for `slots` KV slots: a frontier per slot, and `out` holds capacity rows per slot.
    pub fn with_slots(gpu: &Gpu, kv: &GpuBuffer, gate: &GpuBuffer, ape: &GpuBuffer, out: &GpuBuffer, shape: CompressorShape, slots: usize) -> Result<Self, WgpuError> {
        let CompressorShape { ratio, d, max_tokens, capacity } = shape;
        let slots = slots.max(1);
        let coff = if ratio == 4 { 2 } else { 1 };
        let width = coff * d;
        let rows = if ratio == 4 { 8 } else { ratio };
        let m = max_tokens.max(1) as usize;
        if ratio < 2 || d == 0 || kv.len() < m * width || gate.len() < m * width || ape.len() < ratio * width || out.len() < slots * capacity * d {
            return Err(WgpuError::BadShape {
                what: "compressor".into(),
                reason: format!("ratio {ratio}, rows of {d}: projections, APE ({} floats) or output ({} floats) too small", ape.len(), out.len()),
            });
        }
        let st_kv = GpuBuffer::new(gpu, "compressor kv state", slots * rows * width)?;
        let st_sc = GpuBuffer::new(gpu, "compressor score state", slots * rows * width)?;
        let params: [u32; 4] = [u32_of("compressor row", d)?, u32_of("compressor width", width)?, u32_of("ratio", ratio)?, u32_of("capacity", capacity)?];
        let uni = gpu.uniform("compressor", bytemuck::cast_slice(&params))?;
        let pool = gpu.pipeline("compressor_pool", || Ok(COMPRESSOR_POOL.to_string()))?;
        let pool_bind = gpu.bind_group("compressor pool", &pool, &[&kv.buffer, &gate.buffer, &ape.buffer, &st_kv.buffer, &st_sc.buffer, &out.buffer, &uni, &gpu.step])?;
        let state = gpu.pipeline("compressor_state", || Ok(COMPRESSOR_STATE.to_string()))?;
        let state_bind = gpu.bind_group("compressor state", &state, &[&kv.buffer, &gate.buffer, &ape.buffer, &st_kv.buffer, &st_sc.buffer, &uni, &gpu.step])?;
        let urows = UNDO_ROWS.min(m);
        let undo = (GpuBuffer::new(gpu, "compressor undo rows", urows * width)?, GpuBuffer::new(gpu, "compressor undo rows", urows * width)?);
        let op = Self { pool, pool_bind, state, state_bind, st_kv, st_sc, shape, width, slots, kv_in: kv.buffer.clone(), gate_in: gate.buffer.clone(), undo };
        op.reset(gpu)?;
        Ok(op)
    }

    /// Empties every slot's frontier: kv 0, scores -inf (`CompressorState::new`).
    pub fn reset(&self, gpu: &Gpu) -> Result<(), WgpuError> {
        let n = self.st_sc.len();
        self.st_kv.write(gpu, &vec![0.0; n])?;
        self.st_sc.write(gpu, &vec![f32::NEG_INFINITY; n])
    }

    /// Empties slot `slot`'s frontier (a new sequence there).
    pub fn reset_slot(&self, gpu: &Gpu, slot: usize) -> Result<(), WgpuError> {
        let n = self.slot_len();
        self.st_kv.write_at(gpu, slot * n, &vec![0.0; n])?;
        self.st_sc.write_at(gpu, slot * n, &vec![f32::NEG_INFINITY; n])
    }

    /// Floats of one slot's frontier (kv or score).
    pub fn slot_len(&self) -> usize {
        self.st_kv.len() / self.slots
    }

    /// Width of a state row (`coff * d`).
    pub fn width(&self) -> usize {
        self.width
    }

    pub fn encode(&self, enc: &mut Encoder) -> Result<(), WgpuError> {
        let st = enc.step();
        check_tokens("compressor", st.ntok, self.shape.max_tokens)?;
        let end = enc.end().ok_or_else(|| WgpuError::BadShape { what: "compressor".into(), reason: "position overflow".into() })?;
        if (end as usize) / self.shape.ratio > self.shape.capacity {
            return Err(WgpuError::BadShape { what: "compressed rows".into(), reason: format!("{} rows, capacity {}", end as usize / self.shape.ratio, self.shape.capacity) });
        }
        if st.ntok == 0 {
            return Ok(());
        }
        // Pool the windows closed in this step (from the frontier as found), then advance it. A batched
        // step runs every row's sequence (z) on its own; each closes at most one window.
        let r = self.shape.ratio as u32;
        let (closed, seqs) = if enc.batched() { (1, st.ntok) } else { (end / r - st.pos / r, 1) };
        let pass = enc.pass();
        if closed > 0 {
            pass.set_pipeline(&self.pool);
            pass.set_bind_group(0, &self.pool_bind, &[]);
            pass.dispatch_workgroups((self.shape.d as u32).div_ceil(64), closed, seqs);
        }
        self.dispatch_state(pass, seqs);
        Ok(())
    }

    /// Keeps the projections of the encoder's step rows (after `encode`, before the next layer's
    /// projections overwrite them): what `reapply` advances a restored frontier over.
    pub fn keep_rows(&self, enc: &mut Encoder) -> Result<(), WgpuError> {
        let n = self.undo_rows(enc)?;
        let bytes = (n * self.width * 4) as u64;
        enc.copy_at(&self.kv_in, 0, &self.undo.0.buffer, 0, bytes);
        enc.copy_at(&self.gate_in, 0, &self.undo.1.buffer, 0, bytes);
        Ok(())
    }

    /// The frontier advanced over the first rows of the kept step again (the encoder's step: the
    /// kept rows), no pooling: an in-place undo after the frontier saved before the step is restored.
    pub fn reapply(&self, enc: &mut Encoder) -> Result<(), WgpuError> {
        let n = self.undo_rows(enc)?;
        let bytes = (n * self.width * 4) as u64;
        enc.copy_at(&self.undo.0.buffer, 0, &self.kv_in, 0, bytes);
        enc.copy_at(&self.undo.1.buffer, 0, &self.gate_in, 0, bytes);
        self.dispatch_state(enc.pass(), 1);
        Ok(())
    }

    /// Rows of the encoder's step, when it is one sequence of 1..=the undo rows.
    fn undo_rows(&self, enc: &Encoder) -> Result<usize, WgpuError> {
        let n = enc.step().ntok as usize;
        if n == 0 || n * self.width > self.undo.0.len() || enc.batched() {
            return Err(WgpuError::BadShape { what: "compressor undo".into(), reason: format!("{n} rows (one sequence, 1 to {})", self.undo.0.len() / self.width) });
        }
        Ok(n)
    }

    fn dispatch_state(&self, pass: &mut wgpu::ComputePass<'static>, seqs: u32) {
        pass.set_pipeline(&self.state);
        pass.set_bind_group(0, &self.state_bind, &[]);
        pass.dispatch_workgroups((self.width as u32).div_ceil(64), 1, seqs);
    }
}
