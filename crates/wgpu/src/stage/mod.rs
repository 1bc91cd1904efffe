//! `WgpuStage`: the GPU stage (`ds4_gpu::GpuStage`, the forward pass written once) over this crate's
//! ops. `WgpuOps` implements `ds4_gpu::DeviceOps`: weights resident once, one op instance per layer
//! built at load over fixed buffers (`work`), a step recorded into one command encoder and
//! submitted at `sync`. Nothing is allocated, uploaded or bound per step: a step writes its uniform
//! and its token ids. The KV state holds `GpuOptions::kv_slots` sessions (one part of every KV buffer
//! each, bound once): a batched step decodes one token of several of them, the uniform giving each
//! row's slot and position.
mod device_ops;
mod head;
mod kv;
mod layer;
mod mtp;
mod plan;
mod steer;
mod work;

use std::ops::{Deref, DerefMut};
use std::sync::Arc;

use ds4_gpu::{GpuError, GpuStage};
use ds4_model::memplan::ChunkFit;
use ds4_model::{Config, KvState, LayerRange, Logits, ModelError, Stage};

use crate::encoder::Encoder;
use crate::error::WgpuError;
use crate::gpu::{Gpu, GpuOptions};
use head::{EmbedOps, HeadOps, HeadPick};
use layer::{Build, Layer};
use work::Work;

pub use mtp::{WgpuMtp, WgpuMtpOps};
pub use plan::{plan, plan_bytes, plan_mtp, plan_slots, PlanBytes};

/// Replay keys of the GPU stage (token or hidden input, times no head / logits / logits and pick).
const REPLAY_KEYS: usize = 6;

/// The device side of a stage (see the module doc).
pub struct WgpuOps {
    /// Shared with the MTP drafter's ops on the same device (it reads the stage's output matrix).
    gpu: Arc<Gpu>,
    cfg: Config,
    range: LayerRange,
    work: Work,
    layers: Vec<Layer>,
    embed: Option<EmbedOps>,
    head: Option<HeadOps>,
    hash_routed: bool,
    /// The step being recorded (between `begin_step` and `sync`).
    enc: Option<Encoder>,
    /// The step `begin_step` announced (its encoder is opened by the first op).
    step: Option<crate::gpu::Step>,
    /// Decode steps recorded ahead, by the stage's replay key: wgpu cannot replay a command buffer,
    /// so the stage records the next decode step while the GPU runs the current one and the next
    /// call submits it (`DeviceOps::replay_consumes`).
    prepared: Vec<Option<Encoder>>,
    step_n: usize,
    head_pick: HeadPick,
    /// Logits rows the last step produced.
    head_rows: usize,
    /// Reused staging buffer for one logits row (sampling reads a row per token).
    row_staging: wgpu::Buffer,
    /// KV slots held, and the one single-sequence steps and state ops use.
    slots: usize,
    slot: usize,
    /// Most rows of a journaled step undone in place (`DeviceOps::undo_rows_cap`), and whether the
    /// step being recorded is one (its compressors keep their projection rows).
    undo_cap: usize,
    undo_step: bool,
    /// Directional steering, when installed (`DeviceOps::set_steering`).
    steer: Option<steer::SteerState>,
    /// Test hook: a mistake injected into batched steps (tests show their comparison catches it).
    #[doc(hidden)]
    pub batch_fault: BatchFault,
}

/// A mistake a test injects into batched steps.
#[doc(hidden)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum BatchFault {
    #[default]
    None,
    /// Every row reads and writes slot 0's KV state.
    AllSlotZero,
    /// Every row one position late.
    PositionPlusOne,
}

impl WgpuOps {
    /// Builds the layers `part` of `stage` on `gpu`: uploads their weights once, allocates the KV
    /// state of `slots` sessions for `ctx` and the work buffers for `nmax` tokens, and builds every op.
    pub fn build(gpu: Arc<Gpu>, stage: &Stage, ctx: usize, nmax: usize, part: LayerRange, slots: usize) -> Result<Self, WgpuError> {
        let cfg = stage.cfg.clone();
        let w = &stage.w;
        let slots = plan::check_slots(slots, nmax)?;
        let work = Work::new(&gpu, &cfg, nmax, ctx, work::split_len(&cfg, w, part, ctx, nmax, slots))?;
        let b = Build { gpu: &gpu, cfg: &cfg, w, work: &work, nmax: nmax as u32, ctx, qat: stage.opts.qat, slots };
        let layers = (part.first..=part.last).map(|il| Layer::new(&b, il)).collect::<Result<Vec<_>, _>>()?;
        let embed = if part.embed { EmbedOps::new(&gpu, &cfg, w, &work, nmax as u32)? } else { None };
        let head = if part.head { HeadOps::new(&gpu, &cfg, w, &work, nmax as u32)? } else { None };
        let hash_routed = (part.first..=part.last).any(|il| w.layer(il).tid2eid.is_some());
        let bytes = cfg.n_vocab as u64 * 4;
        let row_staging = gpu.scoped("logits staging", |d| {
            d.create_buffer(&wgpu::BufferDescriptor { label: Some("logits staging"), size: bytes, usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST, mapped_at_creation: false })
        })?;
        gpu.wait()?;
        Ok(Self { gpu, cfg, range: part, work, layers, embed, head, hash_routed, enc: None, step: None, prepared: (0..REPLAY_KEYS).map(|_| None).collect(), step_n: 0, head_pick: HeadPick::Last, head_rows: 0, row_staging, slots, slot: 0, undo_cap: nmax.min(crate::ops::UNDO_ROWS), undo_step: false, steer: None, batch_fault: BatchFault::None })
    }

    pub fn gpu(&self) -> &Gpu {
        &self.gpu
    }

    /// `dst.len()` floats of the logits: one row through the reused staging buffer, more through a
    /// one-off read.
    fn read_floats(&mut self, dst: &mut [f32]) -> ds4_gpu::Result<()> {
        let bytes = dst.len() as u64 * 4;
        if dst.len() > self.work.logits.len() {
            return Err(format!("wgpu: {} logits asked, {} held", dst.len(), self.work.logits.len()).into());
        }
        if bytes > self.row_staging.size() {
            let v = self.work.logits.read(&self.gpu, dst.len()).map_err(device_ops::err)?;
            dst.copy_from_slice(&v);
            return Ok(());
        }
        let mut enc = Encoder::new(&self.gpu, crate::gpu::Step::default());
        enc.copy_at(&self.work.logits.buffer, 0, &self.row_staging, 0, bytes);
        self.gpu.submit(enc).map_err(device_ops::err)?;
        self.gpu.map_read(&self.row_staging, bytes, |v| dst.copy_from_slice(bytemuck::cast_slice(v))).map_err(device_ops::err)
    }
}

/// The GPU stage on a wgpu device (Vulkan or Metal).
pub struct WgpuStage(GpuStage<WgpuOps>);

impl Deref for WgpuStage {
    type Target = GpuStage<WgpuOps>;
    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

impl DerefMut for WgpuStage {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.0
    }
}

fn ge(e: GpuError) -> ModelError {
    ModelError::Invalid(format!("wgpu: {e}"))
}

fn we(e: WgpuError) -> ModelError {
    ModelError::Invalid(format!("wgpu: {e}"))
}

impl WgpuStage {
    /// The layers `part` of `stage` (a sub-range of `stage.w.range`) on the device `opts` selects, sized
    /// for a context of `ctx`, batches of up to `nmax` tokens and `opts.kv_slots` resident sessions.
    /// Refused before any weight is uploaded when the plan does not fit the device.
    pub fn new(stage: &Stage, ctx: usize, nmax: usize, part: LayerRange, opts: &GpuOptions) -> Result<Self, ModelError> {
        Self::new_fitting(stage, ctx, ChunkFit::fixed(nmax), part, opts)
    }

    /// [`WgpuStage::new`] with work buffers for the largest prefill chunk of `fit` whose plan fits
    /// the device (`rows()` tells which); refused with the smallest's numbers when none does.
    pub fn new_fitting(stage: &Stage, ctx: usize, fit: ChunkFit, part: LayerRange, opts: &GpuOptions) -> Result<Self, ModelError> {
        let r = stage.w.range;
        if part.first < r.first || part.last > r.last || part.first > part.last || (part.embed && !r.embed) || (part.head && !r.head) {
            return Err(ModelError::Invalid(format!("wgpu: layers {}..={} are not all loaded (the stage holds {}..={})", part.first, part.last, r.first, r.last)));
        }
        let slots = plan::check_slots(opts.kv_slots, fit.min).map_err(we)?;
        let gpu = Gpu::new(opts).map_err(we)?;
        let cands = fit.candidates();
        let fits = |n: usize| {
            work::fits_bindings(&gpu, &stage.cfg, n, ctx, work::split_len(&stage.cfg, &stage.w, part, ctx, n, slots))
                && plan::check_fits(&gpu, &plan_slots(stage, ctx, n, part, slots), slots, opts.reserve_bytes + fit.reserve).is_ok()
        };
        let nmax = cands[..cands.len() - 1].iter().copied().find(|&n| fits(n)).unwrap_or(fit.min);
        plan::check_fits(&gpu, &plan_slots(stage, ctx, nmax, part, slots), slots, opts.reserve_bytes).map_err(we)?;
        let ops = WgpuOps::build(Arc::new(gpu), stage, ctx, nmax, part, slots).map_err(we)?;
        let cfg = stage.cfg.clone();
        Ok(Self(GpuStage::new(cfg, ops, part, nmax, ctx).map_err(ge)?))
    }

    /// Tokens a forward call may take (the prefill chunk the work buffers were sized for).
    pub fn rows(&self) -> usize { self.0.nmax() }

    /// The adapter's name and API (for logs).
    pub fn device_name(&self) -> String {
        let c = self.0.ops.gpu.caps();
        format!("{} ({:?})", c.adapter, c.backend)
    }

    /// GPU time per op and host time per step since the last call (`DS4_WGPU_PROFILE=1`).
    pub fn profile_report(&self) -> Option<String> {
        self.0.ops.gpu.profile_report()
    }

    /// Same contract as `Stage::forward`.
    pub fn forward(&mut self, kv: &mut KvState, tokens: &[u32], hidden_in: Option<&[f32]>, want: Logits) -> Result<&[f32], ModelError> {
        self.0.forward(kv, tokens, hidden_in, want).map_err(ge)
    }

    /// Greedy pick of the last row on the device (index, log-probability).
    pub fn forward_argmax(&mut self, kv: &mut KvState, tokens: &[u32], hidden_in: Option<&[f32]>) -> Result<(u32, f32), ModelError> {
        self.0.forward_argmax(kv, tokens, hidden_in).map_err(ge)
    }

    pub fn last_logits(&mut self) -> Result<&[f32], ModelError> {
        self.0.last_logits().map_err(ge)
    }

    /// Feeds `tokens` and returns every row's greedy pick (`GpuStage::forward_picks`).
    pub fn forward_picks(&mut self, kv: &mut KvState, tokens: &[u32]) -> Result<&[(u32, f32)], ModelError> {
        self.0.forward_picks(kv, tokens).map_err(ge)
    }

    /// Logits row `row` of the last forward call, downloaded.
    pub fn logits_row(&mut self, row: usize) -> Result<&[f32], ModelError> {
        self.0.logits_row(row).map_err(ge)
    }

    pub fn hidden(&mut self, n: usize) -> Result<&[f32], ModelError> {
        self.0.hidden(n).map_err(ge)
    }

    pub fn download_kv(&mut self, kv: &mut KvState) -> Result<(), ModelError> {
        self.0.download_kv(kv).map_err(ge)
    }

    pub fn upload_kv(&mut self, kv: &KvState) -> Result<(), ModelError> {
        self.0.upload_kv(kv).map_err(ge)
    }

    /// Starts speculative verification at `kv.pos` (see `GpuStage::begin_journal`).
    pub fn begin_journal(&mut self, kv: &KvState) -> Result<(), ModelError> {
        self.0.begin_journal(kv).map_err(ge)
    }

    /// Back to `pos` within the journal (see `GpuStage::rollback`).
    pub fn rollback(&mut self, kv: &mut KvState, pos: usize) -> Result<(), ModelError> {
        self.0.rollback(kv, pos).map_err(ge)
    }

    pub fn end_journal(&mut self) {
        self.0.end_journal()
    }

    /// One decode step for several sessions, each in its own KV slot (see `GpuStage::forward_batch`).
    pub fn forward_batch(&mut self, kvs: &mut [&mut KvState], tokens: &[u32]) -> Result<&[f32], ModelError> {
        self.0.forward_batch(kvs, tokens).map_err(ge)
    }
}
