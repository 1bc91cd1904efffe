//! Hyper-connections (`ds4_model::hc`): the sub-layer entry (flat RMS, mix projection, Sinkhorn,
//! collapse, sub-layer norm), the sub-layer exit, and the output head's collapse + norm, over the
//! step's token rows.
use std::sync::Arc;

use super::step_matvec::StepMatVec;
use super::{check_tokens, grid, u32_of, upload_f32};
use crate::buffer::GpuBuffer;
use crate::encoder::Encoder;
use crate::error::WgpuError;
use crate::gpu::Gpu;
use crate::resident::ResidentTensor;
use crate::shaders::{hc_head_source, hc_pre_source, HC_POST};

/// Largest number of streams the kernels take (`ds4_model::hc::MAX_HC`).
pub const MAX_HC: usize = 8;

/// The hyper-connection shape and constants of the model (`ds4_model::Config`: n_hc, n_embd,
/// sinkhorn_iters, hc_eps, rms_eps).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HcDims {
    pub n_hc: usize,
    pub n_embd: usize,
    pub sinkhorn_iters: usize,
    pub hc_eps: f32,
    pub rms_eps: f32,
}

impl HcDims {
    /// Floats of one token's streams.
    pub fn hc_dim(&self) -> usize {
        self.n_hc * self.n_embd
    }
    /// Rows of a sub-layer's mix projection: (2 + n_hc) x n_hc.
    pub fn n_mix(&self) -> usize {
        (2 + self.n_hc) * self.n_hc
    }
    /// Floats of one token's exit coefficients (`coef` buffer): post[n_hc], then comb[n_hc][n_hc].
    pub fn coef_len(&self) -> usize {
        self.n_hc + self.n_hc * self.n_hc
    }

    fn check(&self, what: &str) -> Result<(), WgpuError> {
        if self.n_hc == 0 || self.n_hc > MAX_HC || self.n_embd == 0 {
            return Err(WgpuError::BadShape { what: what.into(), reason: format!("{} streams of {} (1..={MAX_HC} streams)", self.n_hc, self.n_embd) });
        }
        Ok(())
    }
}

fn need(what: &str, cond: bool, reason: impl FnOnce() -> String) -> Result<(), WgpuError> {
    if cond {
        Ok(())
    } else {
        Err(WgpuError::BadShape { what: what.into(), reason: reason() })
    }
}

/// Sub-layer entry: `xn` = rms_norm(sum_s pre[s] X[s]) * norm, and the exit coefficients into `coef`.
pub struct HcPre {
    mix: StepMatVec,
    pipeline: Arc<wgpu::ComputePipeline>,
    bind: wgpu::BindGroup,
    max_tokens: u32,
}

impl HcPre {
    /// `hc_fn`: n_mix rows of hc_dim (hc_{attn,ffn}_fn); `scale` (3), `base` (n_mix), `norm`
    /// (n_embd: attn_norm or ffn_norm) are uploaded once. Buffers hold max_tokens rows: `x` the
    /// streams (hc_dim), `mix` a scratch (n_mix, may be shared by every layer), `xn` (n_embd),
    /// `coef` (coef_len, read by the matching exit).
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        gpu: &Gpu,
        dims: &HcDims,
        hc_fn: &ResidentTensor,
        scale: &[f32],
        base: &[f32],
        norm: &[f32],
        x: &GpuBuffer,
        mix: &GpuBuffer,
        xn: &GpuBuffer,
        coef: &GpuBuffer,
        max_tokens: u32,
    ) -> Result<Self, WgpuError> {
        let what = format!("hc entry {}", hc_fn.name);
        dims.check(&what)?;
        let (m, hd, nm, e) = (max_tokens as usize, dims.hc_dim(), dims.n_mix(), dims.n_embd);
        need(&what, hc_fn.rows == nm && hc_fn.cols == hd, || format!("projection of {} x {}, expected {nm} x {hd}", hc_fn.rows, hc_fn.cols))?;
        need(&what, scale.len() == 3 && base.len() == nm && norm.len() == e, || format!("scale {} / base {} / norm {}, expected 3 / {nm} / {e}", scale.len(), base.len(), norm.len()))?;
        need(&what, (1..=65535).contains(&max_tokens), || format!("{max_tokens} tokens"))?;
        need(&what, x.len() >= m * hd && mix.len() >= m * nm && xn.len() >= m * e && coef.len() >= m * dims.coef_len(), || "buffers too small for max_tokens".into())?;
        let mixmv = StepMatVec::new(gpu, hc_fn, x, mix, max_tokens)?;
        let (n, w) = (u32_of("streams", dims.n_hc)?, u32_of("width", e)?);
        let pipeline = gpu.pipeline(&format!("hc_pre_{n}x{w}"), || Ok(hc_pre_source(n, w)))?;
        let hw = upload_f32(gpu, &format!("{what} weights"), &[scale, base, norm].concat())?;
        let params: [u32; 8] = [
            u32_of("streams", dims.n_hc)?,
            u32_of("width", e)?,
            u32_of("mix", nm)?,
            u32_of("sinkhorn iterations", dims.sinkhorn_iters)?,
            dims.hc_eps.to_bits(),
            dims.rms_eps.to_bits(),
            0,
            0,
        ];
        let uni = gpu.uniform(&what, bytemuck::cast_slice(&params))?;
        let bind = gpu.bind_group(&what, &pipeline, &[&x.buffer, &mix.buffer, &xn.buffer, &coef.buffer, &hw, &uni, &gpu.step])?;
        Ok(Self { mix: mixmv, pipeline, bind, max_tokens })
    }

    pub fn encode(&self, enc: &mut Encoder) -> Result<(), WgpuError> {
        let ntok = enc.step().ntok;
        check_tokens("hc entry", ntok, self.max_tokens)?;
        self.mix.encode(enc)?;
        let pass = enc.pass();
        pass.set_pipeline(&self.pipeline);
        pass.set_bind_group(0, &self.bind, &[]);
        pass.dispatch_workgroups(ntok.max(1), 1, 1);
        Ok(())
    }
}

/// The exit kernel: X'[c] = post[c] * y + sum_r comb[r][c] * X[r]; y a sub-layer row (k = 0) or
/// the sum of k expert rows plus the shared expert's row.
pub(crate) struct PostKernel {
    pipeline: Arc<wgpu::ComputePipeline>,
    bind: wgpu::BindGroup,
    e: u32,
    max_tokens: u32,
    _dummy: Option<GpuBuffer>,
}

impl PostKernel {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(gpu: &Gpu, dims: &HcDims, x: &GpuBuffer, y: &GpuBuffer, k: usize, shared: Option<&GpuBuffer>, coef: &GpuBuffer, max_tokens: u32) -> Result<Self, WgpuError> {
        let what = "hc exit";
        dims.check(what)?;
        let (m, e) = (max_tokens as usize, dims.n_embd);
        need(what, max_tokens >= 1, || "no tokens".into())?;
        need(what, x.len() >= m * dims.hc_dim() && y.len() >= m * k.max(1) * e && coef.len() >= m * dims.coef_len() && shared.is_none_or(|s| s.len() >= m * e), || {
            "buffers too small for max_tokens".into()
        })?;
        let pipeline = gpu.pipeline("hc_post", || Ok(HC_POST.to_string()))?;
        let dummy = if shared.is_none() { Some(GpuBuffer::new(gpu, "hc exit no shared", 1)?) } else { None };
        let sh = shared.or(dummy.as_ref()).ok_or_else(|| WgpuError::BadShape { what: what.into(), reason: "no shared buffer".into() })?;
        u32_of("hc exit size", m * e)?; // the kernel indexes the rows in u32
        let params: [u32; 8] = [u32_of("streams", dims.n_hc)?, u32_of("width", e)?, u32_of("slots", k)?, shared.is_some() as u32, 0, 0, 0, 0];
        let uni = gpu.uniform(what, bytemuck::cast_slice(&params))?;
        let bind = gpu.bind_group(what, &pipeline, &[&x.buffer, &y.buffer, &sh.buffer, &coef.buffer, &uni, &gpu.step])?;
        Ok(Self { pipeline, bind, e: u32_of("width", e)?, max_tokens, _dummy: dummy })
    }

    pub(crate) fn encode(&self, enc: &mut Encoder) -> Result<(), WgpuError> {
        let ntok = enc.step().ntok;
        check_tokens("hc exit", ntok, self.max_tokens)?;
        // Only this step's rows (the kernel reads the grid's x extent).
        let (x, y) = grid((self.e * ntok).div_ceil(64));
        let pass = enc.pass();
        pass.set_pipeline(&self.pipeline);
        pass.set_bind_group(0, &self.bind, &[]);
        pass.dispatch_workgroups(x, y, 1);
        Ok(())
    }
}

/// Sub-layer exit, in place on the streams `x`: X'[c] = post[c] * y + sum_r comb[r][c] * X[r].
pub struct HcPost(PostKernel);

impl HcPost {
    /// `y`: max_tokens rows of n_embd (the sub-layer output); `coef`: written by the entry.
    pub fn new(gpu: &Gpu, dims: &HcDims, x: &GpuBuffer, y: &GpuBuffer, coef: &GpuBuffer, max_tokens: u32) -> Result<Self, WgpuError> {
        Ok(Self(PostKernel::new(gpu, dims, x, y, 0, None, coef, max_tokens)?))
    }

    pub fn encode(&self, enc: &mut Encoder) -> Result<(), WgpuError> {
        self.0.encode(enc)
    }
}

/// Which rows the head collapses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeadRows {
    /// Every token of the step (out row t).
    All,
    /// The step's last token only (out row 0).
    Last,
}

/// Output head: out = rms_norm(sum_s w[s] X[s]) * norm, w[s] = sigmoid(mix[s] * scale + base[s]) + eps.
pub struct HcHead {
    mix: StepMatVec,
    pipeline: Arc<wgpu::ComputePipeline>,
    bind: wgpu::BindGroup,
    rows: HeadRows,
    max_tokens: u32,
}

impl HcHead {
    /// `hc_fn`: n_hc rows of hc_dim (output_hc_fn); `scale` (output_hc_scale[0]), `base` (n_hc) and
    /// `norm` (output_norm, n_embd) are uploaded once. `mix` is a scratch of max_tokens x n_hc; `out`
    /// holds max_tokens rows of n_embd (one for `HeadRows::Last`).
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        gpu: &Gpu,
        dims: &HcDims,
        hc_fn: &ResidentTensor,
        scale: f32,
        base: &[f32],
        norm: &[f32],
        x: &GpuBuffer,
        mix: &GpuBuffer,
        out: &GpuBuffer,
        rows: HeadRows,
        max_tokens: u32,
    ) -> Result<Self, WgpuError> {
        let what = "hc head";
        dims.check(what)?;
        let (m, hd, n, e) = (max_tokens as usize, dims.hc_dim(), dims.n_hc, dims.n_embd);
        need(what, hc_fn.rows == n && hc_fn.cols == hd, || format!("projection of {} x {}, expected {n} x {hd}", hc_fn.rows, hc_fn.cols))?;
        need(what, base.len() == n && norm.len() == e, || format!("base {} / norm {}, expected {n} / {e}", base.len(), norm.len()))?;
        need(what, (1..=65535).contains(&max_tokens), || format!("{max_tokens} tokens"))?;
        let out_rows = if rows == HeadRows::Last { 1 } else { m };
        need(what, x.len() >= m * hd && mix.len() >= m * n && out.len() >= out_rows * e, || "buffers too small for max_tokens".into())?;
        let mixmv = StepMatVec::new(gpu, hc_fn, x, mix, max_tokens)?;
        let (ns, w) = (u32_of("streams", n)?, u32_of("width", e)?);
        let pipeline = gpu.pipeline(&format!("hc_head_{ns}x{w}"), || Ok(hc_head_source(ns, w)))?;
        let hw = upload_f32(gpu, "hc head weights", &[&[scale][..], base, norm].concat())?;
        let params: [u32; 8] = [u32_of("streams", n)?, u32_of("width", e)?, (rows == HeadRows::Last) as u32, 0, dims.hc_eps.to_bits(), dims.rms_eps.to_bits(), 0, 0];
        let uni = gpu.uniform(what, bytemuck::cast_slice(&params))?;
        let bind = gpu.bind_group(what, &pipeline, &[&x.buffer, &mix.buffer, &out.buffer, &hw, &uni, &gpu.step])?;
        Ok(Self { mix: mixmv, pipeline, bind, rows, max_tokens })
    }

    pub fn encode(&self, enc: &mut Encoder) -> Result<(), WgpuError> {
        let ntok = enc.step().ntok;
        check_tokens("hc head", ntok, self.max_tokens)?;
        self.mix.encode(enc)?;
        let groups = if self.rows == HeadRows::Last { 1 } else { ntok.max(1) };
        let pass = enc.pass();
        pass.set_pipeline(&self.pipeline);
        pass.set_bind_group(0, &self.bind, &[]);
        pass.dispatch_workgroups(groups, 1, 1);
        Ok(())
    }
}
