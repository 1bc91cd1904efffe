//! f32 activation / work buffers (also used for u32 ids: token ids, expert ids).
use crate::counters::Counters;
use crate::error::WgpuError;
use crate::gpu::Gpu;

/// A device buffer of `len` f32 values, bindable as storage, readable back.
pub struct GpuBuffer {
    pub(crate) buffer: wgpu::Buffer,
    len: usize,
}

impl GpuBuffer {
    /// A zeroed buffer of `len` floats (refused when it is over the binding limit).
    pub fn new(gpu: &Gpu, label: &str, len: usize) -> Result<Self, WgpuError> {
        let bytes = (len as u64).max(1).saturating_mul(4);
        gpu.check_binding(label, bytes)?;
        let buffer = gpu.scoped(label, |d| {
            d.create_buffer(&wgpu::BufferDescriptor {
                label: Some(label),
                size: bytes,
                usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST | wgpu::BufferUsages::COPY_SRC,
                mapped_at_creation: false,
            })
        })?;
        Counters::add(&gpu.counters.buffers, 1);
        Ok(Self { buffer, len })
    }

    /// A buffer holding `data`.
    pub fn from_slice(gpu: &Gpu, label: &str, data: &[f32]) -> Result<Self, WgpuError> {
        let b = Self::new(gpu, label, data.len())?;
        b.write(gpu, data)?;
        Ok(b)
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Host -> device write of `data` at the start (counted as an activation write).
    pub fn write(&self, gpu: &Gpu, data: &[f32]) -> Result<(), WgpuError> {
        if data.len() > self.len {
            return Err(WgpuError::BadShape { what: "buffer write".into(), reason: format!("{} floats into a buffer of {}", data.len(), self.len) });
        }
        gpu.queue.write_buffer(&self.buffer, 0, bytemuck::cast_slice(data));
        Counters::add(&gpu.counters.activation_writes, 1);
        gpu.check("buffer write")
    }

    /// The first `n` floats, read back (waits for the queue).
    pub fn read(&self, gpu: &Gpu, n: usize) -> Result<Vec<f32>, WgpuError> {
        self.read_at(gpu, 0, n)
    }

    /// Host -> device write of `data` at float `offset` (a KV slot's part; an activation write).
    pub fn write_at(&self, gpu: &Gpu, offset: usize, data: &[f32]) -> Result<(), WgpuError> {
        if offset.checked_add(data.len()).is_none_or(|e| e > self.len) {
            return Err(WgpuError::BadShape { what: "buffer write".into(), reason: format!("{} floats at {offset} into a buffer of {}", data.len(), self.len) });
        }
        gpu.queue.write_buffer(&self.buffer, offset as u64 * 4, bytemuck::cast_slice(data));
        Counters::add(&gpu.counters.activation_writes, 1);
        gpu.check("buffer write")
    }

    /// `n` floats from float `offset`, read back (waits for the queue).
    pub fn read_at(&self, gpu: &Gpu, offset: usize, n: usize) -> Result<Vec<f32>, WgpuError> {
        if offset.checked_add(n).is_none_or(|e| e > self.len) {
            return Err(WgpuError::BadShape { what: "buffer read".into(), reason: format!("{n} floats at {offset} from a buffer of {}", self.len) });
        }
        let bytes = gpu.read_bytes(&self.buffer, offset as u64 * 4, n as u64 * 4)?;
        Ok(bytemuck::pod_collect_to_vec(&bytes))
    }

    /// Host -> device write of u32 words (token ids, expert ids) at the start (an activation write).
    pub fn write_u32(&self, gpu: &Gpu, data: &[u32]) -> Result<(), WgpuError> {
        if data.len() > self.len {
            return Err(WgpuError::BadShape { what: "buffer write".into(), reason: format!("{} words into a buffer of {}", data.len(), self.len) });
        }
        gpu.queue.write_buffer(&self.buffer, 0, bytemuck::cast_slice(data));
        Counters::add(&gpu.counters.activation_writes, 1);
        gpu.check("buffer write")
    }

    /// The first `n` values read back as u32 words (ids written by a kernel).
    pub fn read_u32(&self, gpu: &Gpu, n: usize) -> Result<Vec<u32>, WgpuError> {
        if n > self.len {
            return Err(WgpuError::BadShape { what: "buffer read".into(), reason: format!("{n} words from a buffer of {}", self.len) });
        }
        let bytes = gpu.read_bytes(&self.buffer, 0, n as u64 * 4)?;
        Ok(bytemuck::pod_collect_to_vec(&bytes))
    }
}
