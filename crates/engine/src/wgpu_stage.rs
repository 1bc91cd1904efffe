//! The wgpu backend of an engine (`--backend vulkan|metal`, cargo feature `wgpu`): the stage's layers
//! on one wgpu device (`ds4_wgpu::WgpuStage`), its device plan, and the adapter probe `auto` uses.
use crate::backend::{AdapterKind, Backend};
use crate::device_stage::DeviceStage;
use ds4_model::memplan::ChunkFit;
use ds4_model::{KvState, Logits, Result, Stage};
use ds4_wgpu::{BackendChoice, GpuOptions, WgpuStage};

/// How to open the device for `backend` (Vulkan or Metal), with `slots` KV slots for the stage.
/// `Precision::Exact` (`--quality`) keeps the prefill products in f32: no cooperative matrices (f16).
pub(crate) fn options(backend: Backend, slots: usize, precision: ds4_quant::Precision) -> GpuOptions { options_reserving(backend, slots, precision, 0) }

/// [`options`] for a stage that shares the device with `reserve` more bytes (the MTP drafter).
fn options_reserving(backend: Backend, slots: usize, precision: ds4_quant::Precision, reserve: u64) -> GpuOptions {
    let choice = if backend == Backend::Metal { BackendChoice::Metal } else { BackendChoice::Vulkan };
    let disable = if precision == ds4_quant::Precision::Exact { ds4_wgpu::wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX } else { ds4_wgpu::wgpu::Features::empty() };
    GpuOptions { backend: choice, kv_slots: slots, disable, reserve_bytes: reserve, ..GpuOptions::default() }
}

/// Device bytes the stage of `stage`'s layers needs at `ctx` / `nmax` with `slots` resident sessions
/// (the memory plan's device line).
pub(crate) fn plan_bytes(stage: &Stage, ctx: usize, nmax: usize, slots: usize) -> u64 { ds4_wgpu::plan_slots(stage, ctx, nmax, stage.w.range, slots).total() }

/// Device bytes the MTP drafter of `mtp` takes beside the stage (`ds4_wgpu::plan_mtp`).
pub(crate) fn mtp_plan_bytes(mtp: &Stage, ctx: usize) -> u64 { ds4_wgpu::plan_mtp(mtp, ctx, MTP_STEP_PAIRS).total() }

/// Builds the stage on the device `backend` names, holding `slots` sessions, with work buffers for the
/// largest prefill chunk of `fit` that fits; it refuses itself,
/// before allocating, when its plan and `reserve` more bytes (the MTP drafter) do not fit the device.
pub(crate) fn load(stage: &Stage, ctx: usize, fit: ChunkFit, backend: Backend, slots: usize, reserve: u64) -> Result<Box<dyn DeviceStage>> {
    let s = WgpuStage::new_fitting(stage, ctx, fit, stage.w.range, &options_reserving(backend, slots, stage.opts.precision, reserve))?;
    Ok(Box::new(WgpuDevice { stage: s, backend }))
}

/// The kind of the best adapter of the platform's wgpu API (opening it, as the stage would); None when
/// none opens.
pub(crate) fn probe() -> Option<AdapterKind> {
    let gpu = ds4_wgpu::Gpu::new(&options(Backend::wgpu_default(), 1, ds4_quant::Precision::Fast)).ok()?;
    Some(if gpu.caps().device_type == ds4_wgpu::wgpu::DeviceType::Cpu { AdapterKind::Cpu } else { AdapterKind::Gpu })
}

/// Pairs one step of the device MTP drafter takes: more than a first draft ever has (the pairs of
/// a verify step plus one), and a run of a prefill chunk's pairs is cut to the block's window
/// (`GpuMtp::forward`) and goes in a few steps.
const MTP_STEP_PAIRS: usize = 32;

struct WgpuDevice {
    stage: WgpuStage,
    backend: Backend,
}

impl DeviceStage for WgpuDevice {
    fn backend(&self) -> Backend { self.backend }

    fn rows(&self) -> usize { self.stage.rows() }

    fn forward(&mut self, kv: &mut KvState, tokens: &[u32], hidden_in: Option<&[f32]>, want: Logits) -> Result<&[f32]> {
        self.stage.forward(kv, tokens, hidden_in, want)
    }

    fn forward_argmax(&mut self, kv: &mut KvState, tokens: &[u32], hidden_in: Option<&[f32]>) -> Result<(u32, f32)> {
        self.stage.forward_argmax(kv, tokens, hidden_in)
    }

    fn last_logits(&mut self) -> Result<&[f32]> { self.stage.last_logits() }

    fn forward_picks(&mut self, kv: &mut KvState, tokens: &[u32]) -> Result<&[(u32, f32)]> { self.stage.forward_picks(kv, tokens) }

    fn logits_row(&mut self, row: usize) -> Result<&[f32]> { self.stage.logits_row(row) }

    fn hidden(&mut self, n: usize) -> Result<&[f32]> { self.stage.hidden(n) }

    fn download_kv(&mut self, kv: &mut KvState) -> Result<()> { self.stage.download_kv(kv) }

    fn upload_kv(&mut self, kv: &KvState) -> Result<()> { self.stage.upload_kv(kv) }

    fn can_journal(&self) -> bool { self.stage.can_journal() }

    fn begin_journal(&mut self, kv: &KvState) -> Result<()> { self.stage.begin_journal(kv) }

    fn rollback(&mut self, kv: &mut KvState, pos: usize) -> Result<()> { self.stage.rollback(kv, pos) }

    fn end_journal(&mut self) { self.stage.end_journal() }

    fn report(&mut self) -> Option<String> {
        let profile = self.stage.profile_report().unwrap_or_default();
        Some(format!("{}: {}{profile}", self.backend.name(), self.stage.device_name()))
    }

    fn mtp_drafter(&mut self, mtp: &Stage, ctx: usize) -> Result<(Box<dyn crate::drafter::DeviceDrafter>, u64)> {
        let d = self.stage.mtp_drafter(mtp, MTP_STEP_PAIRS, ctx)?;
        Ok((Box::new(d), ds4_wgpu::plan_mtp(mtp, ctx, MTP_STEP_PAIRS).total()))
    }

    fn kv_slots(&self) -> usize { self.stage.slots() }

    fn set_steering(&mut self, st: Option<&ds4_model::steering::Steering>, gate: std::sync::Arc<std::sync::atomic::AtomicBool>) -> Result<()> {
        use ds4_gpu::DeviceOps;
        self.stage.ops.set_steering(st, gate).map_err(|e| ds4_model::ModelError::Invalid(format!("wgpu: {e}")))
    }

    fn steer_rows(&mut self, rows: &[bool]) {
        use ds4_gpu::DeviceOps;
        self.stage.ops.steer_rows(rows)
    }

    fn forward_batch(&mut self, kvs: &mut [&mut KvState], tokens: &[u32]) -> Result<&[f32]> { self.stage.forward_batch(kvs, tokens) }
}
