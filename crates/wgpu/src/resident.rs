//! Weights resident on the device: a quantized tensor uploaded once, split across bindings at row
//! boundaries when it is larger than the adapter's storage binding limit (128 MiB on lavapipe,
//! 2 GiB - 1 on NVIDIA through Vulkan), so each dispatch sees whole rows of one part.
use std::sync::Arc;

use ds4_quant::GgmlType;

use crate::counters::Counters;
use crate::error::WgpuError;
use crate::gpu::Gpu;

/// Bytes added after each part: kernels read blocks that start at a 2-mod-4 byte as two words, the
/// second of which may lie just past the last row.
const TAIL_PAD: u64 = 4;

/// Rows [row0, row0 + rows) of a tensor in one buffer, row row0 at `byte_offset` (0 for an upload,
/// the tensor's place in the page window for an import).
pub struct TensorPart {
    pub(crate) buffer: wgpu::Buffer,
    pub row0: usize,
    pub rows: usize,
    pub byte_offset: u32,
    /// Imported from host memory (zero-copy) rather than uploaded.
    pub imported: bool,
}

/// Host bytes a device may wrap without a copy: a read-only file mapping of whole pages, alive as
/// long as its owner (the `Arc` the import keeps) and never written while mapped.
pub trait HostBytes: Send + Sync + 'static {
    fn host_bytes(&self) -> &[u8];
}

impl HostBytes for memmap2::Mmap {
    fn host_bytes(&self) -> &[u8] {
        self
    }
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
    /// The same device bytes under a second owner (no copy): a buffer lives while any owner does.
    pub fn share(&self) -> Self {
        self.stacked(1)
    }

    /// The matrix `copies` times on top of itself (rows `c * rows + r` are row r), over the same
    /// buffers: a grouped product over it applies the matrix to each of `copies` slices of an
    /// activation row (the MTP's h_proj on every HC stream) in one dispatch per part.
    pub fn stacked(&self, copies: usize) -> Self {
        let parts = (0..copies)
            .flat_map(|c| {
                self.parts.iter().map(move |p| TensorPart { buffer: p.buffer.clone(), row0: c * self.rows + p.row0, rows: p.rows, byte_offset: p.byte_offset, imported: p.imported })
            })
            .collect();
        Self { name: self.name.clone(), ty: self.ty, rows: copies * self.rows, cols: self.cols, row_bytes: self.row_bytes, parts }
    }

    /// Uploads `data` (exactly rows x row_bytes(cols)) once, in as many parts as the binding limit needs.
    pub fn upload(gpu: &Gpu, name: &str, ty: GgmlType, data: &[u8], rows: usize, cols: usize) -> Result<Self, WgpuError> {
        let row_bytes = ty
            .row_bytes(cols)
            .ok_or_else(|| WgpuError::BadShape { what: name.into(), reason: format!("{cols} columns is not a whole number of {} blocks", ty.name()) })?;
        if cols == 0 {
            return Err(WgpuError::BadShape { what: name.into(), reason: "zero columns".into() });
        }
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
            parts.push(TensorPart { buffer, row0, rows: n, byte_offset: 0, imported: false });
            row0 += n;
        }
        Ok(Self { name: name.to_string(), ty, rows, cols, row_bytes, parts })
    }

    /// The tensor at `offset` in a read-only mapping (e.g. the GGUF file's mmap). On a device with
    /// unified memory that can wrap host memory (Vulkan VK_EXT_external_memory_host: integrated GPUs,
    /// lavapipe; Metal newBufferWithBytesNoCopy: Apple Silicon) the mapping's pages become the binding
    /// without a copy; elsewhere (discrete GPUs) the bytes are uploaded once. `offset` must be a multiple of 4 (GGUF data is 32-byte aligned).
    pub fn from_mapping<M: HostBytes>(
        gpu: &Gpu,
        name: &str,
        ty: GgmlType,
        map: Arc<M>,
        offset: usize,
        rows: usize,
        cols: usize,
    ) -> Result<Self, WgpuError> {
        let row_bytes = ty
            .row_bytes(cols)
            .ok_or_else(|| WgpuError::BadShape { what: name.into(), reason: format!("{cols} columns is not a whole number of {} blocks", ty.name()) })?;
        if cols == 0 {
            return Err(WgpuError::BadShape { what: name.into(), reason: "zero columns".into() });
        }
        let end = row_bytes.checked_mul(rows).and_then(|n| offset.checked_add(n)).filter(|&e| e <= map.host_bytes().len());
        let Some(end) = end else {
            return Err(WgpuError::BadShape { what: name.into(), reason: format!("{rows} rows x {row_bytes} bytes at {offset} run past the mapping ({} bytes)", map.host_bytes().len()) });
        };
        let unified = matches!(gpu.caps().device_type, wgpu::DeviceType::IntegratedGpu | wgpu::DeviceType::Cpu);
        match gpu.caps().host_import_alignment {
            Some(align) if unified && offset.is_multiple_of(4) => Self::import(gpu, name, ty, map, offset, rows, cols, row_bytes, align),
            _ => Self::upload(gpu, name, ty, &map.host_bytes()[offset..end], rows, cols),
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn import<M: HostBytes>(
        gpu: &Gpu,
        name: &str,
        ty: GgmlType,
        map: Arc<M>,
        offset: usize,
        rows: usize,
        cols: usize,
        row_bytes: usize,
        align: u64,
    ) -> Result<Self, WgpuError> {
        {
            let align = align as usize;
            // The window of a part is page aligned on both ends: up to 2 * align more than its rows.
            let limit = gpu.caps().weight_binding;
            let per = (limit.saturating_sub(2 * align as u64) / row_bytes as u64) as usize;
            if per == 0 {
                return Err(WgpuError::BindingOverLimit { what: format!("one row of {name} (imported)"), bytes: (row_bytes + 2 * align) as u64, limit });
            }
            // The mapping covers whole pages: the last window may end past the file but not past them.
            let bytes = map.host_bytes();
            let mapped_end = bytes.len().next_multiple_of(align);
            let base = bytes.as_ptr();
            let owner: Arc<dyn Send + Sync> = map.clone();
            let mut parts = Vec::new();
            let mut row0 = 0usize;
            while row0 < rows {
                let n = (rows - row0).min(per);
                let start = offset + row0 * row_bytes;
                let stop = start + n * row_bytes;
                let (w0, w1) = (start / align * align, stop.next_multiple_of(align));
                if w1 > mapped_end || !(base as usize).is_multiple_of(align) {
                    return Self::upload(gpu, name, ty, &bytes[offset..offset + rows * row_bytes], rows, cols);
                }
                let label = format!("{name}[{row0}..{}] (host)", row0 + n);
                // The window lies inside the mapping (checked above), which `owner` keeps alive.
                let ptr = base.wrapping_add(w0);
                let buffer = gpu
                    .scoped(&label, |d| crate::host_import::import(d, &label, ptr, (w1 - w0) as u64, owner.clone()))?
                    .map_err(|msg| WgpuError::Device { op: format!("importing {label}"), msg })?;
                Counters::add(&gpu.counters.weight_imports, 1);
                Counters::add(&gpu.counters.buffers, 1);
                parts.push(TensorPart { buffer, row0, rows: n, byte_offset: (start - w0) as u32, imported: true });
                row0 += n;
            }
            Ok(Self { name: name.to_string(), ty, rows, cols, row_bytes, parts })
        }
    }
}
