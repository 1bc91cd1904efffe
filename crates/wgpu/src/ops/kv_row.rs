//! Row finishing of the attention family, in place: RMS norm, partial RoPE at the row's position, and
//! the QAT simulation (FP8 KV rows, Hadamard + FP4 indexer rows), as `ds4_model::stage` does for the
//! KV row, the query heads, the compressed rows (`compressor::push`) and the indexer query / rows.
use std::sync::Arc;

use super::rope::split_turns;
use super::{check_tokens, grid, u32_of};
use crate::buffer::GpuBuffer;
use crate::counters::Counters;
use crate::encoder::Encoder;
use crate::error::WgpuError;
use crate::gpu::Gpu;
use crate::shaders::KV_ROW;

/// The widest row the kernel holds in workgroup memory.
pub const KV_ROW_MAX_DIM: usize = 1024;

/// The norm before the rotation.
#[derive(Clone, Copy)]
pub enum RowNorm<'a> {
    None,
    /// x / rms(x) (the query heads).
    Plain,
    /// x / rms(x) * g (the KV row, compressed rows).
    Weighted(&'a GpuBuffer),
}

/// The QAT step after the rotation (`ds4_model::stage::Options::qat`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RowQat {
    None,
    /// `qat::fp8_simulate` on the non-rotated part, blocks of 64 (KV rows, compressed KV rows).
    Fp8,
    /// `qat::hadamard` then `qat::fp4_simulate` in blocks of 32 over the whole row (indexer).
    HadamardFp4,
}

/// Which rows a step finishes, and their positions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RowPos {
    /// `per_tok` rows per token (1 for the KV row, n_head for queries), token t at `pos + t`;
    /// the buffer holds `max_tokens * per_tok` rows.
    Tokens { per_tok: usize, max_tokens: u32 },
    /// The compressed rows of the windows closed in this step: row c at position `c * ratio`
    /// (rows `pos / ratio .. (pos + ntok) / ratio`); the buffer holds `capacity` rows per KV slot
    /// (slot s from row `s * capacity`).
    Windows { ratio: usize, capacity: usize },
}

pub struct KvRowSpec<'a> {
    pub dim: usize,
    pub norm: RowNorm<'a>,
    pub eps: f32,
    /// Per-pair rotation frequencies (`ds4_model::rope::Rope::freqs`); they rotate the last
    /// `2 * freqs.len()` values.
    pub freqs: &'a [f64],
    pub qat: RowQat,
    pub rows: RowPos,
}

pub struct KvRow {
    pipeline: Arc<wgpu::ComputePipeline>,
    bind: wgpu::BindGroup,
    rows: RowPos,
    wg_x: u32,
    _dummy: Option<GpuBuffer>,
}

impl KvRow {
    pub fn new(gpu: &Gpu, x: &GpuBuffer, spec: &KvRowSpec) -> Result<Self, WgpuError> {
        let bad = |reason: String| WgpuError::BadShape { what: "kv row".into(), reason };
        let (dim, np) = (spec.dim, spec.freqs.len());
        if dim == 0 || dim > KV_ROW_MAX_DIM || np == 0 || 2 * np > dim || spec.freqs.iter().any(|f| !f.is_finite() || *f < 0.0) {
            return Err(bad(format!("rows of {dim} (at most {KV_ROW_MAX_DIM}) with {np} rotated pairs")));
        }
        if spec.qat == RowQat::HadamardFp4 && !dim.is_power_of_two() {
            return Err(bad(format!("the Hadamard transform needs a power-of-two row, not {dim}")));
        }
        let max_rows = match spec.rows {
            RowPos::Tokens { per_tok, max_tokens } if per_tok > 0 => per_tok * max_tokens.max(1) as usize,
            RowPos::Windows { ratio, capacity } if ratio > 0 => capacity,
            _ => return Err(bad("zero rows per token or a zero ratio".into())),
        };
        if x.len() < max_rows * dim {
            return Err(bad(format!("buffer of {} floats for {max_rows} rows of {dim}", x.len())));
        }
        let (norm, g) = match spec.norm {
            RowNorm::None => (0u32, None),
            RowNorm::Plain => (1, None),
            RowNorm::Weighted(g) => (2, Some(g)),
        };
        if g.is_some_and(|g| g.len() < dim) {
            return Err(bad(format!("norm weight of {} floats for rows of {dim}", g.map_or(0, |g| g.len()))));
        }
        let pipeline = gpu.pipeline("kv_row", || Ok(KV_ROW.to_string()))?;
        let dummy = if g.is_none() { Some(GpuBuffer::new(gpu, "kv row no weight", 1)?) } else { None };
        let gb = g.or(dummy.as_ref()).map(|b| &b.buffer).ok_or_else(|| bad("no weight buffer".into()))?;
        let table: Vec<f32> = spec.freqs.iter().flat_map(|f| split_turns(f / std::f64::consts::TAU)).collect();
        let bytes: &[u8] = bytemuck::cast_slice(&table);
        let turns = gpu.buffer_with("kv row turns", bytes, bytes.len() as u64, wgpu::BufferUsages::STORAGE)?;
        Counters::add(&gpu.counters.weight_uploads, 1);
        Counters::add(&gpu.counters.weight_bytes, bytes.len() as u64);
        let wg_x = grid(u32_of("kv rows", max_rows)?).0;
        let (per_tok, ratio, cap) = match spec.rows {
            RowPos::Tokens { per_tok, .. } => (per_tok, 0, 0),
            RowPos::Windows { ratio, capacity } => (1, ratio, capacity),
        };
        let qat = match spec.qat {
            RowQat::None => 0u32,
            RowQat::Fp8 => 1,
            RowQat::HadamardFp4 => 2,
        };
        let hscale = (1.0 / (dim as f64).sqrt()) as f32;
        let params: [u32; 12] = [
            u32_of("row", dim)?,
            norm,
            u32_of("pairs", np)?,
            qat,
            u32_of("rows per token", per_tok)?,
            u32_of("ratio", ratio)?,
            spec.eps.to_bits(),
            wg_x,
            hscale.to_bits(),
            u32_of("capacity", cap)?,
            0,
            0,
        ];
        let uni = gpu.uniform("kv row", bytemuck::cast_slice(&params))?;
        let bind = gpu.bind_group("kv row", &pipeline, &[&x.buffer, gb, &turns, &uni, &gpu.step])?;
        Ok(Self { pipeline, bind, rows: spec.rows, wg_x, _dummy: dummy })
    }

    /// The rows (workgroups) this step finishes: a batched step gives each sequence one workgroup for
    /// the window its token may close.
    fn rows_of_step(&self, enc: &Encoder) -> Result<u32, WgpuError> {
        let (ntok, pos) = (enc.step().ntok, enc.step().pos);
        let end = enc.end().filter(|&e| e <= 1 << 24).ok_or_else(|| WgpuError::BadShape { what: "kv row".into(), reason: "positions must stay below 2^24".into() })?;
        Ok(match self.rows {
            RowPos::Tokens { per_tok, max_tokens } => {
                check_tokens("kv row", ntok, max_tokens)?;
                ntok * per_tok as u32
            }
            RowPos::Windows { ratio, capacity } => {
                let r = ratio as u32;
                if (end / r) as usize > capacity {
                    return Err(WgpuError::BadShape { what: "compressed rows".into(), reason: format!("{} rows, capacity {capacity}", end / r) });
                }
                if enc.batched() {
                    ntok
                } else {
                    end / r - pos / r
                }
            }
        })
    }

    pub fn encode(&self, enc: &mut Encoder) -> Result<(), WgpuError> {
        let n = self.rows_of_step(enc)?;
        if n == 0 {
            return Ok(());
        }
        let pass = enc.pass();
        pass.set_pipeline(&self.pipeline);
        pass.set_bind_group(0, &self.bind, &[]);
        pass.dispatch_workgroups(self.wg_x.min(n), n.div_ceil(self.wg_x), 1);
        Ok(())
    }
}
