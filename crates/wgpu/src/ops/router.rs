//! MoE router (`ds4_model::moe::route` per token): gate logits, then biased top-k or hash selection
//! and the routing weights. Output: per token k expert ids (ascending) and their weights.
use std::sync::Arc;

use super::step_matvec::StepMatVec;
use super::{check_tokens, u32_of, upload_f32, upload_u32};
use crate::buffer::GpuBuffer;
use crate::encoder::Encoder;
use crate::error::WgpuError;
use crate::gpu::Gpu;
use crate::resident::ResidentTensor;
use crate::shaders::ROUTE;

/// Most experts and experts per token the routing kernel takes.
pub const MAX_EXPERTS: usize = 1024;
pub const MAX_EXPERTS_PER_TOKEN: usize = 16;

/// The model's routing constants (`ds4_model::Config`: n_expert, n_expert_used,
/// expert_weights_norm, expert_weights_scale).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RouteConfig {
    pub n_expert: usize,
    pub k: usize,
    pub normalize: bool,
    pub scale: f32,
}

/// How a layer chooses its experts.
#[derive(Debug, Clone, Copy)]
pub enum Routing<'a> {
    /// The k best scores plus the optional bias (exp_probs_b).
    TopK { bias: Option<&'a [f32]> },
    /// The token's row of the hash table (tid2eid: n_vocab rows of k expert ids).
    Hash { tid2eid: &'a [u32] },
}

pub struct Router {
    logits: StepMatVec,
    pipeline: Arc<wgpu::ComputePipeline>,
    bind: wgpu::BindGroup,
    max_tokens: u32,
}

impl Router {
    /// `gate_inp`: n_expert rows of n_embd; the bias / hash table are uploaded once (hash ids must be
    /// below n_expert). Buffers hold max_tokens rows: `xn` (n_embd), `logits` a scratch (n_expert),
    /// `tokens` (ids, read by hash layers), `ids` and `weights` (k each).
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        gpu: &Gpu,
        cfg: &RouteConfig,
        gate_inp: &ResidentTensor,
        routing: Routing,
        xn: &GpuBuffer,
        logits: &GpuBuffer,
        tokens: &GpuBuffer,
        ids: &GpuBuffer,
        weights: &GpuBuffer,
        max_tokens: u32,
    ) -> Result<Self, WgpuError> {
        let what = format!("router {}", gate_inp.name);
        let bad = |reason: String| WgpuError::BadShape { what: what.clone(), reason };
        let (ne, k, m) = (cfg.n_expert, cfg.k, max_tokens as usize);
        if ne == 0 || ne > MAX_EXPERTS || k == 0 || k > MAX_EXPERTS_PER_TOKEN || k > ne {
            return Err(bad(format!("{k} of {ne} experts (at most {MAX_EXPERTS_PER_TOKEN} of {MAX_EXPERTS})")));
        }
        if gate_inp.rows != ne {
            return Err(bad(format!("{} gate rows for {ne} experts", gate_inp.rows)));
        }
        if !(1..=65535).contains(&max_tokens) || logits.len() < m * ne || tokens.len() < m || ids.len() < m * k || weights.len() < m * k {
            return Err(bad(format!("{max_tokens} tokens: buffers too small")));
        }
        let (bias, table, n_vocab) = match routing {
            Routing::TopK { bias } => {
                if bias.is_some_and(|b| b.len() != ne) {
                    return Err(bad(format!("bias of {} values for {ne} experts", bias.map_or(0, |b| b.len()))));
                }
                (bias, None, 0)
            }
            Routing::Hash { tid2eid } => {
                if tid2eid.is_empty() || !tid2eid.len().is_multiple_of(k) {
                    return Err(bad(format!("hash table of {} ids is not rows of {k}", tid2eid.len())));
                }
                if let Some(id) = tid2eid.iter().find(|&&id| id as usize >= ne) {
                    return Err(bad(format!("hash table names expert {id} of {ne}")));
                }
                (None, Some(tid2eid), tid2eid.len() / k)
            }
        };
        let lmv = StepMatVec::new(gpu, gate_inp, xn, logits, max_tokens)?;
        let pipeline = gpu.pipeline("route", || Ok(ROUTE.to_string()))?;
        let bias_buf = upload_f32(gpu, &format!("{what} bias"), bias.unwrap_or(&[0.0]))?;
        let table_buf = upload_u32(gpu, &format!("{what} tid2eid"), table.unwrap_or(&[0]))?;
        let params: [u32; 8] = [
            u32_of("experts", ne)?,
            u32_of("experts per token", k)?,
            cfg.normalize as u32,
            cfg.scale.to_bits(),
            bias.is_some() as u32,
            table.is_some() as u32,
            u32_of("vocabulary", n_vocab)?,
            0,
        ];
        let uni = gpu.uniform(&what, bytemuck::cast_slice(&params))?;
        let bind = gpu.bind_group(&what, &pipeline, &[&logits.buffer, &bias_buf, &table_buf, &tokens.buffer, &ids.buffer, &weights.buffer, &uni, &gpu.step])?;
        Ok(Self { logits: lmv, pipeline, bind, max_tokens })
    }

    pub fn encode(&self, enc: &mut Encoder) -> Result<(), WgpuError> {
        let ntok = enc.step().ntok;
        check_tokens("router", ntok, self.max_tokens)?;
        self.logits.encode(enc)?;
        let pass = enc.pass();
        pass.set_pipeline(&self.pipeline);
        pass.set_bind_group(0, &self.bind, &[]);
        pass.dispatch_workgroups(ntok.max(1), 1, 1);
        Ok(())
    }
}
