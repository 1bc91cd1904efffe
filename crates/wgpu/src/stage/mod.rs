//! `WgpuStage`: the GPU stage (`ds4_gpu::GpuStage`, the forward pass written once) over this crate's
//! ops. `WgpuOps` implements `ds4_gpu::DeviceOps`: weights resident once, one op instance per layer
//! built at load over fixed buffers, a step recorded into one command encoder and submitted at `sync`.
use ds4_model::{KvState, LayerRange, Logits, ModelError, Stage};

use crate::gpu::GpuOptions;

/// The device side of a stage (see the module doc).
pub struct WgpuOps {
    _private: (),
}

/// The GPU stage on a wgpu device (Vulkan or Metal).
pub struct WgpuStage(WgpuOps);

fn todo_err() -> ModelError { ModelError::Invalid("wgpu: the GPU stage is not built yet".into()) }

impl WgpuStage {
    /// The layers `part` of `stage` (a sub-range of `stage.w.range`) on the device `opts` selects, sized
    /// for a context of `ctx` and batches of up to `nmax` tokens. Refused before anything is allocated
    /// when the plan does not fit the device.
    pub fn new(stage: &Stage, ctx: usize, nmax: usize, part: LayerRange, opts: &GpuOptions) -> Result<Self, ModelError> {
        let _ = (stage, ctx, nmax, part, opts);
        Err(ModelError::Invalid("wgpu: the GPU stage is not built yet".into()))
    }

    /// The adapter's name and API (for logs).
    pub fn device_name(&self) -> String { String::new() }

    /// Same contract as `Stage::forward`.
    pub fn forward(&mut self, kv: &mut KvState, tokens: &[u32], hidden_in: Option<&[f32]>, want: Logits) -> Result<&[f32], ModelError> {
        { let _ = (&self.0, kv, tokens, hidden_in, want); Err(todo_err()) }
    }

    /// Greedy pick of the last row on the device (index, log-probability).
    pub fn forward_argmax(&mut self, kv: &mut KvState, tokens: &[u32], hidden_in: Option<&[f32]>) -> Result<(u32, f32), ModelError> {
        { let _ = (&self.0, kv, tokens, hidden_in); Err(todo_err()) }
    }

    pub fn last_logits(&mut self) -> Result<&[f32], ModelError> { { let _ = (&self.0, ); Err(todo_err()) } }

    pub fn hidden(&mut self, n: usize) -> Result<&[f32], ModelError> { { let _ = (&self.0, n); Err(todo_err()) } }

    pub fn download_kv(&mut self, kv: &mut KvState) -> Result<(), ModelError> { { let _ = (&self.0, kv); Err(todo_err()) } }

    pub fn upload_kv(&mut self, kv: &KvState) -> Result<(), ModelError> { { let _ = (&self.0, kv); Err(todo_err()) } }
}

/// Bytes of device memory a stage of `part` needs at `ctx` / `nmax` (weights, KV, work buffers): the
/// memory plan's GPU line for this backend.
pub fn plan_bytes(stage: &Stage, ctx: usize, nmax: usize, part: LayerRange) -> u64 {
    let _ = (stage, ctx, nmax, part);
    0
}
