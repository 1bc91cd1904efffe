//! Token embedding: the rows of the step's token ids (a device buffer of u32), copied into every
//! hyper-connection stream (as `ds4_model::Stage` does before layer 0).
use std::sync::Arc;

use super::{check_tokens, u32_of};
use crate::buffer::GpuBuffer;
use crate::encoder::Encoder;
use crate::error::WgpuError;
use crate::gpu::Gpu;
use crate::resident::ResidentTensor;
use crate::shaders::embed_source;
use ds4_quant::GgmlType;

pub struct Embed {
    pipeline: Arc<wgpu::ComputePipeline>,
    parts: Vec<wgpu::BindGroup>,
    wg_x: u32,
    rows: usize,
    max_tokens: u32,
}

impl Embed {
    /// `table`: n_vocab rows of n_embd (F32, F16 or Q8_0, split across bindings or not); `tokens`:
    /// up to max_tokens ids; `x`: max_tokens rows of n_hc x n_embd (the streams).
    pub fn new(gpu: &Gpu, table: &ResidentTensor, tokens: &GpuBuffer, x: &GpuBuffer, n_hc: usize, max_tokens: u32) -> Result<Self, WgpuError> {
        let bad = |reason: String| WgpuError::BadShape { what: format!("embedding {}", table.name), reason };
        let ty = match table.ty {
            GgmlType::F32 => 0u32,
            GgmlType::F16 => 1,
            GgmlType::Q8_0 => 2,
            t => return Err(bad(format!("{} tables are not supported (F32, F16, Q8_0)", t.name()))),
        };
        let (e, m) = (table.cols, max_tokens as usize);
        if n_hc == 0 || max_tokens == 0 || max_tokens > 65535 || tokens.len() < m || x.len() < m * n_hc * e {
            return Err(bad(format!("{n_hc} streams, {max_tokens} tokens: buffers of {} ids / {} floats", tokens.len(), x.len())));
        }
        let pipeline = gpu.pipeline("embed", || Ok(embed_source()))?;
        let mut parts = Vec::with_capacity(table.parts.len());
        for (i, part) in table.parts.iter().enumerate() {
            let params: [u32; 8] = [
                u32_of("embedding width", e)?,
                u32_of("streams", n_hc)?,
                u32_of("row", part.row0)?,
                u32_of("rows", part.rows)?,
                u32_of("row bytes", table.row_bytes)?,
                ty,
                part.byte_offset,
                0,
            ];
            let label = format!("{}#{i}", table.name);
            let uni = gpu.uniform(&label, bytemuck::cast_slice(&params))?;
            parts.push(gpu.bind_group(&label, &pipeline, &[&part.buffer, &tokens.buffer, &x.buffer, &uni, &gpu.step])?);
        }
        Ok(Self { pipeline, parts, wg_x: u32_of("embedding width", e.div_ceil(64))?, rows: table.rows, max_tokens })
    }

    /// Refuses token ids outside the table (the kernel skips them: check before writing the ids).
    pub fn check_ids(&self, ids: &[u32]) -> Result<(), WgpuError> {
        match ids.iter().find(|&&t| t as usize >= self.rows) {
            Some(t) => Err(WgpuError::BadShape { what: "token id".into(), reason: format!("{t} is outside the vocabulary ({})", self.rows) }),
            None => Ok(()),
        }
    }

    pub fn encode(&self, enc: &mut Encoder) -> Result<(), WgpuError> {
        let ntok = enc.step().ntok;
        check_tokens("embedding", ntok, self.max_tokens)?;
        let pass = enc.pass();
        pass.set_pipeline(&self.pipeline);
        for b in &self.parts {
            pass.set_bind_group(0, b, &[]);
            pass.dispatch_workgroups(self.wg_x, ntok.max(1), 1);
        }
        Ok(())
    }
}
