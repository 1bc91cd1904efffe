//! SwiGLU with the V4 clamps, in place on the gate buffer.
use std::sync::Arc;

use super::{check_tokens, grid, u32_of};
use crate::buffer::GpuBuffer;
use crate::encoder::Encoder;
use crate::error::WgpuError;
use crate::gpu::Gpu;
use crate::shaders::SWIGLU;

pub struct SwiGlu {
    pipeline: Arc<wgpu::ComputePipeline>,
    bind: wgpu::BindGroup,
    n: u32,
    max_tokens: u32,
}

impl SwiGlu {
    /// a = silu(min(a, c)) * clamp(b, -c, c) over up to max_tokens rows of n (no clamp when `clamp` is None).
    pub fn new(gpu: &Gpu, a: &GpuBuffer, b: &GpuBuffer, n: usize, clamp: Option<f32>, max_tokens: u32) -> Result<Self, WgpuError> {
        let total = n * max_tokens as usize;
        if a.len() < total || b.len() < total {
            return Err(WgpuError::BadShape { what: "swiglu".into(), reason: format!("buffers of {} / {} floats, need {total}", a.len(), b.len()) });
        }
        let pipeline = gpu.pipeline("swiglu", || Ok(SWIGLU.to_string()))?;
        let n32 = u32_of("swiglu width", n)?;
        u32_of("swiglu size", total)?; // the kernel indexes the rows in u32
        let params: [u32; 4] = [n32, clamp.is_some() as u32, clamp.unwrap_or(0.0).to_bits(), 0];
        let uni = gpu.uniform("swiglu", bytemuck::cast_slice(&params))?;
        let bind = gpu.bind_group("swiglu", &pipeline, &[&a.buffer, &b.buffer, &uni, &gpu.step])?;
        Ok(Self { pipeline, bind, n: n32, max_tokens })
    }

    pub fn encode(&self, enc: &mut Encoder) -> Result<(), WgpuError> {
        let ntok = enc.step().ntok;
        check_tokens("swiglu", ntok, self.max_tokens)?;
        // Only this step's rows (the kernel reads the grid's x extent).
        let (x, y) = grid((self.n * ntok).div_ceil(64));
        let pass = enc.pass();
        pass.set_pipeline(&self.pipeline);
        pass.set_bind_group(0, &self.bind, &[]);
        pass.dispatch_workgroups(x, y, 1);
        Ok(())
    }
}
