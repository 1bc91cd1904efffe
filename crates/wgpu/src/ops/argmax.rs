//! Device greedy pick: index of the maximum, log-sum-exp and log-probability of one logits row.
use std::sync::Arc;

use super::u32_of;
use crate::buffer::GpuBuffer;
use crate::counters::Counters;
use crate::encoder::Encoder;
use crate::error::WgpuError;
use crate::gpu::Gpu;
use crate::shaders::{argmax_source, ARGMAX_BLOCKS};

/// The pick of one row.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Pick {
    /// First index of the maximum (0 when every value is NaN or -inf).
    pub index: u32,
    /// log softmax of the pick (max - lse).
    pub logprob: f32,
    pub max: f32,
    /// log of the sum of exp over the row.
    pub lse: f32,
}

pub struct Argmax {
    pipeline: Arc<wgpu::ComputePipeline>,
    /// Phase 0 (slices of the row into the parts) and phase 1 (the parts into `out`).
    binds: [wgpu::BindGroup; 2],
    out: wgpu::Buffer,
    staging: wgpu::Buffer,
    _parts: wgpu::Buffer,
}

impl Argmax {
    /// Picks over the first n floats of `x`; the parts, the 16-byte result and its staging buffer are
    /// made once.
    pub fn new(gpu: &Gpu, x: &GpuBuffer, n: usize) -> Result<Self, WgpuError> {
        if n == 0 || x.len() < n {
            return Err(WgpuError::BadShape { what: "argmax".into(), reason: format!("{n} values in a buffer of {}", x.len()) });
        }
        let pipeline = gpu.pipeline("argmax", || Ok(argmax_source()))?;
        let n32 = u32_of("argmax width", n)?;
        let mk = |label: &str, size: u64, usage| gpu.scoped(label, |d| d.create_buffer(&wgpu::BufferDescriptor { label: Some(label), size, usage, mapped_at_creation: false }));
        let parts = mk("argmax parts", ARGMAX_BLOCKS as u64 * 16, wgpu::BufferUsages::STORAGE)?;
        let out = mk("argmax out", 16, wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC)?;
        let staging = mk("argmax staging", 16, wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST)?;
        Counters::add(&gpu.counters.buffers, 3);
        let bind = |phase: u32| -> Result<wgpu::BindGroup, WgpuError> {
            let uni = gpu.uniform("argmax", bytemuck::cast_slice(&[n32, phase, 0, 0]))?;
            gpu.bind_group("argmax", &pipeline, &[&x.buffer, &parts, &out, &uni])
        };
        let binds = [bind(0)?, bind(1)?];
        Ok(Self { pipeline, binds, out, staging, _parts: parts })
    }

    /// Records the pick and the copy of its result to the staging buffer.
    pub fn encode(&self, enc: &mut Encoder) -> Result<(), WgpuError> {
        let pass = enc.pass();
        pass.set_pipeline(&self.pipeline);
        pass.set_bind_group(0, &self.binds[0], &[]);
        pass.dispatch_workgroups(ARGMAX_BLOCKS, 1, 1);
        pass.set_bind_group(0, &self.binds[1], &[]);
        pass.dispatch_workgroups(1, 1, 1);
        enc.copy(&self.out, &self.staging, 16);
        Ok(())
    }

    /// The result of the last run (after `Gpu::run` returned).
    pub fn result(&self, gpu: &Gpu) -> Result<Pick, WgpuError> {
        let words: [u32; 4] = gpu.map_read(&self.staging, 16, |v| {
            let mut w = [0u32; 4];
            w.copy_from_slice(bytemuck::cast_slice(&v[..16]));
            w
        })?;
        Ok(Pick { index: words[0], logprob: f32::from_bits(words[1]), max: f32::from_bits(words[2]), lse: f32::from_bits(words[3]) })
    }
}
