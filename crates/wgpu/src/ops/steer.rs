//! Directional steering of a sub-layer output (`ds4_model::steering`) before its HC exit: one
//! workgroup per token edits part row 0 of the token's output so that the sum the exit takes
//! becomes y - s·v·(v·y), slot after slot. The scales and the per-row flags are read from a control
//! buffer the stage writes per step (`SteerCtl`), so recorded steps need no rebinding.
use std::sync::Arc;

use super::{check_tokens, u32_of};
use crate::buffer::GpuBuffer;
use crate::encoder::Encoder;
use crate::error::WgpuError;
use crate::gpu::Gpu;
use crate::shaders::STEER;

/// Which scale of a slot applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SteerSite {
    Ffn = 0,
    Attn = 1,
}

/// The directions and control words every layer's steering reads.
pub struct SteerTables<'a> {
    /// slots x n_layers x e floats.
    pub dirs: &'a GpuBuffer,
    /// 2 x slots scale words (f32 bits: ffn, attn), then one flag word per row.
    pub ctl: &'a GpuBuffer,
    pub slots: usize,
    pub n_layers: usize,
}

pub struct Steer {
    pipeline: Arc<wgpu::ComputePipeline>,
    bind: wgpu::BindGroup,
    max_tokens: u32,
    _dummy: Option<GpuBuffer>,
}

impl Steer {
    /// `parts`: max_tokens x k rows of `e` (the edit goes into each token's row 0); `extra`: a row per
    /// token added to the sum (the shared expert); `layer`: this layer's index among the directions'.
    #[allow(clippy::too_many_arguments)]
    pub fn new(gpu: &Gpu, parts: &GpuBuffer, k: usize, extra: Option<&GpuBuffer>, e: usize, t: &SteerTables, layer: usize, site: SteerSite, max_tokens: u32) -> Result<Self, WgpuError> {
        let what = "steering";
        let m = max_tokens as usize;
        let ok = k >= 1
            && parts.len() >= m * k * e
            && extra.is_none_or(|x| x.len() >= m * e)
            && layer < t.n_layers
            && t.dirs.len() >= t.slots * t.n_layers * e
            && t.ctl.len() >= 2 * t.slots + m
            && (1..=65535).contains(&max_tokens);
        if !ok {
            return Err(WgpuError::BadShape { what: what.into(), reason: format!("buffers too small for {m} tokens of {k} x {e}, layer {layer} of {}, {} slots", t.n_layers, t.slots) });
        }
        let pipeline = gpu.pipeline("steer", || Ok(STEER.to_string()))?;
        let dummy = if extra.is_none() { Some(GpuBuffer::new(gpu, "steering no extra", 1)?) } else { None };
        let ex = extra.or(dummy.as_ref()).ok_or_else(|| WgpuError::BadShape { what: what.into(), reason: "no extra buffer".into() })?;
        let params: [u32; 8] = [u32_of("width", e)?, u32_of("parts", k)?, extra.is_some() as u32, u32_of("slots", t.slots)?, u32_of("layer", layer)?, u32_of("layers", t.n_layers)?, site as u32, 0];
        let uni = gpu.uniform(what, bytemuck::cast_slice(&params))?;
        let bind = gpu.bind_group(what, &pipeline, &[&parts.buffer, &ex.buffer, &t.dirs.buffer, &t.ctl.buffer, &uni, &gpu.step])?;
        Ok(Self { pipeline, bind, max_tokens, _dummy: dummy })
    }

    pub fn encode(&self, enc: &mut Encoder) -> Result<(), WgpuError> {
        let ntok = enc.step().ntok;
        check_tokens("steering", ntok, self.max_tokens)?;
        let pass = enc.pass();
        pass.set_pipeline(&self.pipeline);
        pass.set_bind_group(0, &self.bind, &[]);
        pass.dispatch_workgroups(ntok.max(1), 1, 1);
        Ok(())
    }
}
