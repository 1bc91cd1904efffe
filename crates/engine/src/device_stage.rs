//! The device side of an engine, whatever the GPU API: one trait over the CUDA pipeline and the wgpu
//! stage, so the engine drives any of them the same way (forward, greedy pick on the device, KV
//! download/upload for sessions and the disk cache) without one branch per backend.
use crate::backend::Backend;
use ds4_model::{KvState, Logits, Result};

/// A stage's layers on a device. Same contract as `ds4_model::Stage` for `forward`; the KV state lives
/// on the device, `kv` only carries the position between calls unless downloaded or uploaded.
pub(crate) trait DeviceStage: Send {
    /// Which backend this is (for `Engine::backend`).
    fn backend(&self) -> Backend;

    /// Same contract as `Stage::forward`.
    fn forward(&mut self, kv: &mut KvState, tokens: &[u32], hidden_in: Option<&[f32]>, want: Logits) -> Result<&[f32]>;

    /// Feeds `tokens` and returns the greedy next token and its log-probability, taken on the device.
    fn forward_argmax(&mut self, kv: &mut KvState, tokens: &[u32], hidden_in: Option<&[f32]>) -> Result<(u32, f32)>;

    /// The last logits row of the last forward call, downloaded.
    fn last_logits(&mut self) -> Result<&[f32]>;

    /// The HC streams after the last forward call (n × hc_dim), downloaded.
    fn hidden(&mut self, n: usize) -> Result<&[f32]>;

    /// Copies the device KV state into `kv` (at `kv.pos`).
    fn download_kv(&mut self, kv: &mut KvState) -> Result<()>;

    /// Makes `kv` the device state: the next forward call continues from `kv.pos`.
    fn upload_kv(&mut self, kv: &KvState) -> Result<()>;

    /// Counters for benchmark output (None when the backend has none).
    fn report(&mut self) -> Option<String>;
}
