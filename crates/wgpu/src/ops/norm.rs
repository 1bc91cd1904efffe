//! RMS norm in place over the step's token rows.
use std::sync::Arc;

use super::{check_tokens, u32_of};
use crate::buffer::GpuBuffer;
use crate::encoder::Encoder;
use crate::error::WgpuError;
use crate::gpu::Gpu;
use crate::shaders::RMS_NORM;

pub struct RmsNorm {
    pipeline: Arc<wgpu::ComputePipeline>,
    bind: wgpu::BindGroup,
    max_tokens: u32,
    /// Rows of n per token (the MTP input norms each HC stream of a token).
    per_tok: u32,
    // Keeps the placeholder weight alive when there is none.
    _dummy: Option<GpuBuffer>,
}

impl RmsNorm {
    /// `x` holds up to max_tokens rows of n; `g` (n floats) scales the result when given.
    pub fn new(gpu: &Gpu, x: &GpuBuffer, n: usize, g: Option<&GpuBuffer>, eps: f32, max_tokens: u32) -> Result<Self, WgpuError> {
        Self::per_token(gpu, x, n, 1, g, eps, max_tokens)
    }

    /// As `new` with `per_tok` rows of n per token (token-major): each row normed on its own.
    pub fn per_token(gpu: &Gpu, x: &GpuBuffer, n: usize, per_tok: usize, g: Option<&GpuBuffer>, eps: f32, max_tokens: u32) -> Result<Self, WgpuError> {
        let rows = per_tok * max_tokens as usize;
        if n == 0 || per_tok == 0 || (per_tok > 1 && rows > 65535) || x.len() < n * rows || g.is_some_and(|g| g.len() < n) {
            return Err(WgpuError::BadShape { what: "rms norm".into(), reason: format!("row of {n}, buffers too small or empty row") });
        }
        let pipeline = gpu.pipeline("rms_norm", || Ok(RMS_NORM.to_string()))?;
        let dummy = if g.is_none() { Some(GpuBuffer::new(gpu, "norm no weight", 1)?) } else { None };
        let gb = g.or(dummy.as_ref()).map(|b| &b.buffer).ok_or_else(|| WgpuError::BadShape { what: "rms norm".into(), reason: "no weight buffer".into() })?;
        let params: [u32; 4] = [u32_of("norm width", n)?, g.is_some() as u32, eps.to_bits(), u32_of("norm rows per token", per_tok)?];
        let uni = gpu.uniform("rms norm", bytemuck::cast_slice(&params))?;
        let bind = gpu.bind_group("rms norm", &pipeline, &[&x.buffer, gb, &uni, &gpu.step])?;
        Ok(Self { pipeline, bind, max_tokens, per_tok: per_tok as u32, _dummy: dummy })
    }

    pub fn encode(&self, enc: &mut Encoder) -> Result<(), WgpuError> {
        let ntok = enc.step().ntok;
        check_tokens("rms norm", ntok, self.max_tokens)?;
        let pass = enc.pass();
        pass.set_pipeline(&self.pipeline);
        pass.set_bind_group(0, &self.bind, &[]);
        pass.dispatch_workgroups(ntok.max(1) * self.per_tok, 1, 1);
        Ok(())
    }
}
