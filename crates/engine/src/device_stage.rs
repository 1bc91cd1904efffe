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

    /// Tokens a forward call may take: the prefill chunk the device's work buffers hold.
    fn rows(&self) -> usize;

    /// Same contract as `Stage::forward`.
    fn forward(&mut self, kv: &mut KvState, tokens: &[u32], hidden_in: Option<&[f32]>, want: Logits) -> Result<&[f32]>;

    /// Feeds `tokens` and returns the greedy next token and its log-probability, taken on the device.
    fn forward_argmax(&mut self, kv: &mut KvState, tokens: &[u32], hidden_in: Option<&[f32]>) -> Result<(u32, f32)>;

    /// The last logits row of the last forward call, downloaded.
    fn last_logits(&mut self) -> Result<&[f32]>;

    /// Feeds `tokens` (token input) and returns every row's greedy pick (index, log-probability),
    /// taken on the device where the step can (a verify step); the logits stay there (`logits_row`).
    fn forward_picks(&mut self, kv: &mut KvState, tokens: &[u32]) -> Result<&[(u32, f32)]>;

    /// Logits row `row` of the last forward call, downloaded.
    fn logits_row(&mut self, row: usize) -> Result<&[f32]>;

    /// The HC streams after the last forward call (n × hc_dim), downloaded.
    fn hidden(&mut self, n: usize) -> Result<&[f32]>;

    /// Copies the device KV state into `kv` (at `kv.pos`).
    fn download_kv(&mut self, kv: &mut KvState) -> Result<()>;

    /// Makes `kv` the device state: the next forward call continues from `kv.pos`.
    fn upload_kv(&mut self, kv: &KvState) -> Result<()>;

    /// Whether speculative verification can run here (`begin_journal`), checked when `--mtp` loads.
    fn can_journal(&self) -> bool { false }

    /// Starts speculative verification at `kv.pos` (later forward calls can be undone). Backends whose
    /// multi-token forward does not reproduce decode steps bit for bit refuse it.
    fn begin_journal(&mut self, _kv: &KvState) -> Result<()> {
        Err(ds4_model::ModelError::Invalid(format!("KV rollback is not available on the {} backend", self.backend().name())))
    }

    /// Back to `pos` within the journal.
    fn rollback(&mut self, _kv: &mut KvState, _pos: usize) -> Result<()> {
        Err(ds4_model::ModelError::Invalid(format!("KV rollback is not available on the {} backend", self.backend().name())))
    }

    /// Ends the journal, keeping the state.
    fn end_journal(&mut self) {}

    /// Counters for benchmark output (None when the backend has none).
    fn report(&mut self) -> Option<String>;

    /// The MTP drafter of `mtp` (`Mtp::stage`, the block bound from the MTP file) on this device,
    /// reading the stage's output matrix, with a cache for `ctx` positions; and its device bytes.
    fn mtp_drafter(&mut self, _mtp: &ds4_model::Stage, _ctx: usize) -> Result<(Box<dyn crate::drafter::DeviceDrafter>, u64)> {
        Err(ds4_model::ModelError::Invalid(format!("the MTP drafter does not run on the {} backend", self.backend().name())))
    }

    /// Installs directional steering on the device (None removes it); `gate` turns it on or off
    /// between steps. Backends without it refuse.
    fn set_steering(&mut self, st: Option<&ds4_model::steering::Steering>, _gate: std::sync::Arc<std::sync::atomic::AtomicBool>) -> Result<()> {
        match st {
            Some(_) => Err(ds4_model::ModelError::Invalid(format!("--dir-steering-file: directional steering is not built for the {} backend: use --cpu, --vulkan or --metal", self.backend().name()))),
            None => Ok(()),
        }
    }

    /// Which sessions of the next batched steps are steered (empty: all).
    fn steer_rows(&mut self, _rows: &[bool]) {}

    /// KV slots the device holds: sessions resident at once, each in the slot `KvState::slot` names.
    fn kv_slots(&self) -> usize { 1 }

    /// One decode step for several sessions, each in its own slot (the `Stage::forward_batch`
    /// contract: one logits row per session, each bit-identical to a step of it alone).
    fn forward_batch(&mut self, _kvs: &mut [&mut KvState], _tokens: &[u32]) -> Result<&[f32]> {
        Err(ds4_model::ModelError::Invalid(format!("batched decode is not yet available on the {} backend: decode one sequence at a time", self.backend().name())))
    }
}
