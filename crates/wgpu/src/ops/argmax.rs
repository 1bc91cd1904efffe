//! Device greedy pick: index of the maximum, log-sum-exp and log-probability of one logits row.
use std::sync::Arc;

use super::u32_of;
use crate::buffer::GpuBuffer;
use crate::counters::Counters;
use crate::encoder::Encoder;
use crate::error::WgpuError;
use crate::gpu::Gpu;
use crate::shaders::ARGMAX;

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
    bind: wgpu::BindGroup,
    out: wgpu::Buffer,
    staging: wgpu::Buffer,
}

impl Argmax {
    /// Picks over the first n floats of `x`; the 16-byte result and its staging buffer are made once.
    pub fn new(gpu: &Gpu, x: &GpuBuffer, n: usize) -> Result<Self, WgpuError> {
        if n == 0 || x.len() < n {
            return Err(WgpuError::BadShape { what: "argmax".into(), reason: format!("{n} values in a buffer of {}", x.len()) });
        }
        let pipeline = gpu.pipeline("argmax", || Ok(ARGMAX.to_string()))?;
        let params: [u32; 4] = [u32_of("argmax width", n)?, 0, 0, 0];
        let uni = gpu.uniform("argmax", bytemuck::cast_slice(&params))?;
        let mk = |label: &str, usage| gpu.scoped(label, |d| d.create_buffer(&wgpu::BufferDescriptor { label: Some(label), size: 16, usage, mapped_at_creation: false }));
        let out = mk("argmax out", wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC)?;
        let staging = mk("argmax staging", wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST)?;
        Counters::add(&gpu.counters.buffers, 2);
        let bind = gpu.bind_group("argmax", &pipeline, &[&x.buffer, &out, &uni])?;
        Ok(Self { pipeline, bind, out, staging })
    }

    /// Records the pick and the copy of its result to the staging buffer.
    pub fn encode(&self, enc: &mut Encoder) -> Result<(), WgpuError> {
        let pass = enc.pass();
        pass.set_pipeline(&self.pipeline);
        pass.set_bind_group(0, &self.bind, &[]);
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
