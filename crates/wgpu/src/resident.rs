//! Weights resident on the device: a quantized tensor uploaded once, split across bindings at row
//! boundaries when it is larger than the adapter's storage binding limit (128 MiB on lavapipe,
//! 2 GiB - 1 on NVIDIA through Vulkan), so each dispatch sees whole rows of one part.
use ds4_quant::GgmlType;

use crate::counters::Counters;
use crate::error::WgpuError;
use crate::gpu::Gpu;

/// Bytes added after each part: kernels read blocks that start at a 2-mod-4 byte as two words, the
/// second of which may lie just past the last row.
const TAIL_PAD: u64 = 4;

/// Rows [row0, row0 + rows) of a tensor in one buffer (row row0 at byte 0).
pub struct TensorPart {
    pub(crate) buffer: wgpu::Buffer,
    pub row0: usize,
    pub rows: usize,
}

/// A row-major quantized matrix (`rows` rows of `cols` elements of `ty`) resident on the device.
pub struct ResidentTensor {
    pub name: String,
    pub ty: GgmlType,
    pub rows: usize,
    pub cols: usize,
    pub row_bytes: usize,
    pub parts: Vec<TensorPart>,
}

/// Rows per part so that a part plus its padding fits in `limit` bytes.
fn rows_per_part(row_bytes: u64, limit: u64) -> u64 {
    limit.saturating_sub(TAIL_PAD) / row_bytes
}

impl ResidentTensor {
    /// Uploads `data` (exactly rows x row_bytes(cols)) once, in as many parts as the binding limit needs.
    pub fn upload(gpu: &Gpu, name: &str, ty: GgmlType, data: &[u8], rows: usize, cols: usize) -> Result<Self, WgpuError> {
        let row_bytes = ty
            .row_bytes(cols)
            .ok_or_else(|| WgpuError::BadShape { what: name.into(), reason: format!("{cols} columns is not a whole number of {} blocks", ty.name()) })?;
        if data.len() != row_bytes * rows {
            return Err(WgpuError::BadShape { what: name.into(), reason: format!("{} bytes, expected {rows} rows x {row_bytes}", data.len()) });
        }
        let limit = gpu.caps().weight_binding;
        let per = rows_per_part(row_bytes as u64, limit);
        if per == 0 {
            return Err(WgpuError::BindingOverLimit { what: format!("one row of {name}"), bytes: row_bytes as u64 + TAIL_PAD, limit });
        }
        let mut parts = Vec::new();
        let mut row0 = 0usize;
        while row0 < rows {
            let n = (rows - row0).min(per as usize);
            let bytes = &data[row0 * row_bytes..(row0 + n) * row_bytes];
            let size = (bytes.len() as u64 + TAIL_PAD).next_multiple_of(4);
            let label = format!("{name}[{row0}..{}]", row0 + n);
            let buffer = gpu.buffer_with(&label, bytes, size, wgpu::BufferUsages::STORAGE)?;
            Counters::add(&gpu.counters.weight_uploads, 1);
            Counters::add(&gpu.counters.weight_bytes, bytes.len() as u64);
            parts.push(TensorPart { buffer, row0, rows: n });
            row0 += n;
        }
        Ok(Self { name: name.to_string(), ty, rows, cols, row_bytes, parts })
    }
}
