//! `CudaOps`: the CUDA backend of the GPU stage (`ds4_gpu::GpuStage`, the forward pass written once over
//! `DeviceOps`), and `CudaStage`, that stage on CUDA. All weights are uploaded once at construction;
//! KV state and work buffers are allocated once from the memory plan's sizes (batch `nmax` = the
//! prefill chunk, context `ctx`); a forward call then performs no device allocation and no weight
//! transfer (only the token ids in and the logits out).
use crate::gpu::{DBuf, Gpu, Result, A, ALLOCS, WEIGHT_UPLOADS};
pub use crate::host_pin::WeightPlace;
use crate::matvec::{cdiv, DM};
use ds4_gguf::GgmlType;
use ds4_gpu::{GpuError, GpuStage, Step};
use ds4_model::memplan::ChunkFit;
use ds4_model::{Config, KvState, LayerRange, ModelError, Options, Stage};
use std::sync::atomic::Ordering;

/// Batches at least this large go through dequantize-to-f16 + cuBLAS instead of the mat-vec kernels.
const GEMM_MIN: usize = 16;

/// Most rows of a verify step (MTP: the current token and up to 4 drafts, with room to spare).
pub const VERIFY_ROWS: usize = 8;

mod attention;
mod batch;
mod blocks;
mod build;
mod device_ops;
mod exact_rows;
mod ffn;
mod graph;
mod hidden_io;
pub(super) mod host_time;
mod kv_io;
mod mtp;
mod state;
mod undo;

pub use batch::EXACT_BATCH_ROWS;
pub use build::GpuPlan;
pub use mtp::{CudaMtp, CudaMtpOps, CUDA_MTP_STEP_PAIRS};

use graph::DecodeGraph;

struct DHc {
    fn_: DM,
    scale: u64,
    base: u64,
}

struct DComp {
    ape: u64,
    kv: DM,
    gate: DM,
    norm: u64,
}

struct DIdx {
    q_b: DM,
    proj: DM,
    comp: DComp,
}

struct DLayer {
    ratio: usize,
    freqs: u64,
    hc_attn: DHc,
    attn_norm: u64,
    q_a: DM,
    q_a_norm: u64,
    q_b: DM,
    kv: DM,
    kv_norm: u64,
    sinks: u64,
    out_a: DM,
    out_b: DM,
    comp: Option<DComp>,
    indexer: Option<DIdx>,
    hc_ffn: DHc,
    ffn_norm: u64,
    gate_inp: DM,
    exp_bias: Option<u64>,
    tid2eid: Option<u64>,
    gate_exps: DM,
    up_exps: DM,
    down_exps: DM,
    shared: Option<[DM; 3]>,
    clamp: f32,
}

impl DLayer {
    fn mats_mut(&mut self) -> Vec<&mut DM> {
        let mut v = vec![&mut self.hc_attn.fn_, &mut self.q_a, &mut self.q_b, &mut self.kv, &mut self.out_a, &mut self.out_b, &mut self.hc_ffn.fn_, &mut self.gate_inp];
        if let Some(c) = self.comp.as_mut() {
            v.extend([&mut c.kv, &mut c.gate]);
        }
        if let Some(i) = self.indexer.as_mut() {
            v.extend([&mut i.q_b, &mut i.proj, &mut i.comp.kv, &mut i.comp.gate]);
        }
        if let Some(s) = self.shared.as_mut() {
            let [a, b, c] = s;
            v.extend([a, b, c]);
        }
        v.extend([&mut self.gate_exps, &mut self.up_exps, &mut self.down_exps]);
        v
    }
}

struct DHead {
    hc_fn: DM,
    hc_scale: u64,
    hc_base: u64,
    norm: u64,
    output: DM,
}

/// Device KV state of one layer: raw ring, compressed rows, indexer rows, compressor frontiers.
struct DKv {
    ring: DBuf,
    comp: Option<DBuf>,
    st_kv: Option<DBuf>,
    st_sc: Option<DBuf>,
    st_len: usize,
    idx: Option<DBuf>,
    ist_kv: Option<DBuf>,
    ist_sc: Option<DBuf>,
    ist_len: usize,
    /// Snapshot of the mutable parts (ring, frontiers), restored when a session rewinds to it.
    snap: DBuf,
    /// What a verify step overwrites, kept for its in-place undo (slot 0 only; undo.rs).
    undo: Option<DBuf>,
}

impl DKv {
    /// Device addresses of a compressor's output rows and frontier (kv, score); 0 where absent.
    fn compressor(&self, which: ds4_gpu::Compressor) -> (u64, u64, u64) {
        let p = |b: &Option<DBuf>| b.as_ref().map_or(0, |b| b.ptr);
        match which {
            ds4_gpu::Compressor::Kv => (p(&self.comp), p(&self.st_kv), p(&self.st_sc)),
            ds4_gpu::Compressor::Indexer => (p(&self.idx), p(&self.ist_kv), p(&self.ist_sc)),
        }
    }
}

struct Work {
    x: DBuf,
    flat: DBuf,
    mix: DBuf,
    mixes: DBuf,
    cur: DBuf,
    xn: DBuf,
    qr: DBuf,
    q: DBuf,
    kvb: DBuf,
    ck: DBuf,
    cg: DBuf,
    pooled: DBuf,
    /// The indexer compressor's scratch for one token (decode runs it beside the main compressor).
    ick: DBuf,
    icg: DBuf,
    ipool: DBuf,
    iq: DBuf,
    iw: DBuf,
    scores: DBuf,
    ldsc: usize,
    sel: DBuf,
    o: DBuf,
    low: DBuf,
    y: DBuf,
    rlog: DBuf,
    eids: DBuf,
    ew: DBuf,
    ex_a: DBuf,
    ex_b: DBuf,
    ex_out: DBuf,
    gx: DBuf,
    gw: DBuf,
    gtok: DBuf,
    /// Row r·k + i → r (the slots of a batched step's routed experts read their row's activations).
    rep_tok: DBuf,
    /// The positions of a batched step's rows (i64, one per session).
    bpos: DBuf,
    slot_pos: DBuf,
    counts: DBuf,
    cursor: DBuf,
    sh_a: DBuf,
    sh_b: DBuf,
    sh_out: DBuf,
    logits: DBuf,
    tokens: DBuf,
    top1: DBuf,
    /// Decode attention partials: per split and head, d outputs, then (max, sum) pairs.
    adec: DBuf,
    adec_splits: usize,
    wh: DBuf,
    wh_elems: usize,
    xh: DBuf,
    /// Prefill expert scratch: `ewh_slots` f16 matrices of `ewh_slot` elements (a group of experts
    /// dequantized by one launch per matrix kind).
    ewh: DBuf,
    ewh_slot: usize,
    ewh_slots: usize,
    /// Q8_K copy of a decode activation (int8 values, then one f32 scale per 256 in `xqd`) for the
    /// int8-activation expert mat-vecs (Precision::Fast).
    xq: DBuf,
    xqd: DBuf,
    /// Q8_0 copies of one-token mat-vec inputs (Precision::Fast), `xq80_cap` values per stream.
    xq80: DBuf,
    xq80d: DBuf,
    xq80_cap: usize,
    /// Int8 copies of one-token activations written by the kernels that produce them (Precision::Fast):
    /// Q8_0 of the sub-layer input xn, Q8_K of xn (routed experts), Q8_0 of the normalised q_a output,
    /// of the attention output, and of the shared expert's SwiGLU.
    q8_xn: ActQ8,
    q8k_xn: ActQ8,
    q8_qr: ActQ8,
    q8_o: ActQ8,
    q8_sh: ActQ8,
    /// Group index of each (row, group) slot of the grouped output projection over exact rows.
    gids: DBuf,
    /// Block records of the fused decode sub-layer entry (`hc_entry_dec`; a row's each for exact
    /// rows).
    hcd_part: DBuf,
    /// Per row of an exact-rows step: its entry's barrier count and flag, its router's ticket (4 ints).
    hcd_rows: DBuf,
    /// The decode entry's barrier count and flag.
    hcd_bar: DBuf,
    /// Tile list of the grouped expert GEMM (`gptr_cap` tiles of 4 ints).
    gptrs: DBuf,
    gptr_cap: usize,
    /// Copy table of an in-place undo (`jobs_cap` jobs of 3 u64: undo.rs).
    jobs: DBuf,
    jobs_cap: usize,
}

/// An int8 activation copy: values, then one f32 scale per block (32 values for Q8_0, 256 for Q8_K).
struct ActQ8 {
    q: DBuf,
    d: DBuf,
}

impl ActQ8 {
    fn pair(&self) -> (u64, u64) { (self.q.ptr, self.d.ptr) }
}

/// A sub-layer exit not yet applied to the streams: X'[c] = post[c]·y + Σ_r comb[r][c]·X[r] with the
/// mixes in `wk.mixes`, y the attention output (`wk.y`) or the sum of `k` weighted expert rows at
/// `rows` plus the shared expert's output `add` (0: none).
#[derive(Clone, Copy)]
enum PendingExit {
    Attn,
    Ffn { rows: u64, k: usize, add: u64 },
}

/// Floats of one token's `hc_entry_dec` block records (`e` embedding, `nm` mix rows): e / 256 blocks of
/// the mix parts (from an even count) and HCE_NG = 15 Gram doubles (hc_entry_decode.cu).
pub(crate) fn hc_entry_part_floats(e: usize, nm: usize) -> usize {
    (e / 256).max(1) * (((nm + 1) & !1) + 30)
}

/// What an `hc_entry_dec` launch does beside the entry itself: the weights of the sub-layer, the int8
/// copies of xn it writes (values, scales; 0: none), its barrier, and the exit it applies first.
struct Entry {
    hc_fn: DM,
    scale: u64,
    base: u64,
    norm: u64,
    copies: [u64; 4],
    bar: u64,
    exit: Option<PendingExit>,
}

/// Which int8 copies of the sub-layer input the entry kernel wrote (consumed by the products after it).
#[derive(Clone, Copy, Default)]
struct XnCopies {
    q80: bool,
    q8k: bool,
}

/// Counters of what the device did since the last reset.
#[derive(Debug, Clone, Copy, Default)]
pub struct CudaStats {
    pub device_allocs: u64,
    pub weight_uploads: u64,
}

/// Decisions and buffers a layer's ops hand to the ones after them within a step.
#[derive(Clone, Copy, Default)]
struct LayerStep {
    /// The int8 copies of xn the sub-layer entry wrote.
    xc: XnCopies,
    /// The Q8_0 copy of the normalised low-rank query, when q_b takes it.
    pre_qr: Option<(u64, u64)>,
    /// The indexer's selection (0: every compressed row).
    sel: u64,
    /// The Q8_0 copy of the attention output (decode), taken by the grouped output projection.
    pre_o: Option<(u64, u64)>,
    /// The shared expert's output (0: none).
    shared_out: u64,
    /// Row order of the routed experts' outputs (0: token-major).
    slot_pos: u64,
}

/// The CUDA backend: resident weights, KV state, work buffers and the kernels that run the ops.
pub struct CudaOps {
    pub cfg: Config,
    /// Activation rows the work buffers hold (the prefill chunk; `ChunkFit` chose it).
    rows: usize,
    opts: Options,
    range: LayerRange,
    embed: Option<DM>,
    layers: Vec<DLayer>,
    head: Option<DHead>,
    /// The selected KV slot's device state (what the one-sequence ops and that slot's decode graphs use).
    kv: Vec<DKv>,
    /// The selected slot, and every other slot's KV set by slot (the selected slot's entry is empty:
    /// `select_slot` swaps sets, so the buffers, and the pointers each slot's graphs captured, never move).
    slot: usize,
    parked: Vec<Vec<DKv>>,
    /// (slot, position) of each row of the batched step in progress.
    batch: Vec<(usize, usize)>,
    /// Rows a batched step may have: the slots, or `VERIFY_ROWS` for a verify step's rows.
    batch_cap: usize,
    /// The step in progress computes every row as its decode step does (`exact_rows.rs`).
    exact: bool,
    /// Batches of distinct sessions of up to this many rows take exact rows ([`EXACT_BATCH_ROWS`] by
    /// default, every batch with `--deterministic`).
    exact_batch_rows: usize,
    /// The batched step in progress has one slot on several rows (a verify step): its per-row ops run
    /// in row order on one stream.
    same_slot: bool,
    wk: Work,
    /// Host copy of the undo copy table (reused: nothing allocated per step).
    undo_table: Vec<u64>,
    /// Rows of a step slot 0's undo buffers hold (undo.rs).
    undo_cap: usize,
    ctx: usize,
    counts_host: Vec<i32>,
    _weights: Vec<DBuf>,
    /// The registered host pages the weights are read from (WeightPlace::Host).
    _pinned: Option<std::sync::Arc<crate::host_pin::Pinned>>,
    /// Where the weight matrices are read from.
    pub weight_place: WeightPlace,
    /// The GPU part of the memory plan, as checked before the weights were placed.
    pub gpu_plan: GpuPlan,
    /// Bytes of the weight matrices (in device memory, or read in place from the host).
    pub weight_bytes: u64,
    pub upload_secs: f64,
    /// Batches at least this large use dequantize + f16 GEMMs (tests set a huge value to keep every
    /// product on the f32 mat-vec kernels).
    pub gemm_min: usize,
    /// Prefill expert GEMMs as one grouped launch per matrix kind (`moe_gemm`); false: one cuBLAS GEMM
    /// per expert over the side streams (tests compare the two).
    pub grouped_gemm: bool,
    /// Decode routed experts (Q2_K, IQ2_XXS) take int8 activations (Q8_K) as the CPU's
    /// `Precision::Fast` does; `Precision::Exact` keeps f32 activations.
    pub fast_experts: bool,
    /// One-token split-Q8_0 products take Q8_0 activations (the CPU's `Precision::Fast`).
    pub fast_q8: bool,
    /// The exit the streams in `x` still owe (decode), applied by the next entry kernel or by
    /// [`CudaOps::flush_exit`].
    pend: Option<PendingExit>,
    /// Rows the pending exit covers (exact rows: one per row; decode: 1).
    pend_rows: usize,
    /// What the current layer's ops hand on.
    ls: LayerStep,
    /// The step in progress is a decode step: the position is read from `dpos` on the device, so one
    /// launch sequence serves every position and can be replayed as a CUDA graph.
    decode_mode: bool,
    dpos: DBuf,
    /// Captured decode graphs, per KV slot (a graph holds its slot's KV pointers), by (hidden input,
    /// logits wanted).
    graphs: Vec<[Option<DecodeGraph>; 6]>,
    /// Recorded batched steps, by the slots of their rows in order (positions are read on the device).
    batch_graphs: Vec<(Vec<usize>, DecodeGraph)>,
    /// The capture in progress has begun (`begin_record`).
    capturing: bool,
    host_time: host_time::HostTime,
    /// Pinned buffers for hidden rows of a prefill chunk coming in or going out (a distributed
    /// stage's hop), made at the first such copy.
    staging: Option<crate::staging::HostStaging>,
    /// Last: dropped after every device buffer above.
    g: Gpu,
}

// SAFETY: the raw CUDA handles a backend owns (stream, module, functions, cuBLAS handle, events, graphs,
// device pointers) belong to its context, which every entry point binds to the calling thread first
// (`DeviceOps::bind`); `&mut self` makes the use exclusive. This lets a server build the stage on one
// thread and run it on its worker thread.
unsafe impl Send for CudaOps {}

impl Drop for CudaOps {
    fn drop(&mut self) {
        // The device buffers are freed right after this, possibly on another thread than the one that
        // built the stage: make the context current here.
        let _ = self.g.bind();
    }
}

/// The GPU stage on CUDA.
pub struct CudaStage(GpuStage<CudaOps>);

impl std::ops::Deref for CudaStage {
    type Target = GpuStage<CudaOps>;
    fn deref(&self) -> &Self::Target { &self.0 }
}

impl std::ops::DerefMut for CudaStage {
    fn deref_mut(&mut self) -> &mut Self::Target { &mut self.0 }
}

pub(crate) fn me(s: String) -> ModelError { ModelError::Invalid(format!("cuda: {s}")) }

/// A stage error as the CPU stage's error type (callers treat both backends alike).
fn ge(e: GpuError) -> ModelError { ModelError::Invalid(format!("cuda: {e}")) }

fn ty_code(t: GgmlType) -> i32 {
    match t {
        GgmlType::F32 => 0,
        GgmlType::F16 => 1,
        GgmlType::Q8_0 => 8,
        GgmlType::BF16 => 30,
        _ => -1,
    }
}

impl CudaStage {
    /// Uploads the weights of `stage` (its bound, mapped tensors) and allocates KV state for `ctx` and
    /// work buffers for batches of up to `nmax` tokens.
    pub fn new(stage: &Stage, ctx: usize, nmax: usize) -> ds4_model::Result<Self> { Self::build(stage, ctx, nmax, stage.w.range, 0, WeightPlace::Device, 1) }

    /// [`CudaStage::new`] with the weights in `place`.
    pub fn new_placed(stage: &Stage, ctx: usize, nmax: usize, place: WeightPlace) -> ds4_model::Result<Self> { Self::build(stage, ctx, nmax, stage.w.range, 0, place, 1) }

    /// The layers `part` of `stage` on CUDA device `device`: one of several stages of a pipeline over
    /// GPUs (each owns its layers' weights and KV; the hidden state passes between them).
    pub fn new_part(stage: &Stage, ctx: usize, nmax: usize, part: LayerRange, device: usize) -> ds4_model::Result<Self> { Self::build(stage, ctx, nmax, part, device, WeightPlace::Device, 1) }

    /// [`CudaStage::new_part`] with the weights in `place`. With [`WeightPlace::Host`] the stage reads
    /// `stage`'s mapped weights while it runs: `stage` must outlive it.
    pub fn new_part_placed(stage: &Stage, ctx: usize, nmax: usize, part: LayerRange, device: usize, place: WeightPlace) -> ds4_model::Result<Self> {
        Self::build(stage, ctx, nmax, part, device, place, 1)
    }

    /// [`CudaStage::new_part_placed`] holding `slots` KV states (sessions decoded together by
    /// `forward_batch`, `KvState::slot` picking one; counted by the GPU plan). `slots` must not
    /// exceed `nmax` (a batched step takes one activation row per session).
    pub fn new_slots(stage: &Stage, ctx: usize, nmax: usize, part: LayerRange, device: usize, place: WeightPlace, slots: usize) -> ds4_model::Result<Self> {
        Self::new_fitting(stage, ctx, ChunkFit::fixed(nmax), part, device, place, slots)
    }

    /// [`CudaStage::new_slots`] with work buffers for the largest prefill chunk of `fit` that fits
    /// beside the weights (`rows()` tells which).
    pub fn new_fitting(stage: &Stage, ctx: usize, fit: ChunkFit, part: LayerRange, device: usize, place: WeightPlace, slots: usize) -> ds4_model::Result<Self> {
        let ops = CudaOps::build(stage, ctx, fit, part, device, place, slots).map_err(me)?;
        let (range, rows) = (ops.range, ops.rows);
        let cfg = ops.cfg.clone();
        Ok(Self(GpuStage::new(cfg, ops, range, rows, ctx).map_err(ge)?))
    }

    fn build(stage: &Stage, ctx: usize, nmax: usize, part: LayerRange, device: usize, place: WeightPlace, slots: usize) -> ds4_model::Result<Self> {
        Self::new_fitting(stage, ctx, ChunkFit::fixed(nmax), part, device, place, slots)
    }

    /// Tokens a forward call may take (the prefill chunk the work buffers were sized for).
    pub fn rows(&self) -> usize { self.0.nmax() }

    /// Device allocations and weight uploads so far (process-wide counters).
    pub fn stats() -> CudaStats {
        CudaStats { device_allocs: ALLOCS.load(Ordering::Relaxed), weight_uploads: WEIGHT_UPLOADS.load(Ordering::Relaxed) }
    }

    pub fn device_name(&self) -> &str { &self.0.ops.g.name }

    /// Per-kernel CUDA-event profile since the last report, or None when profiling is off.
    pub fn profile_report(&mut self) -> Option<String> {
        let g = &mut self.0.ops.g;
        g.bind().ok()?;
        g.prof_report()
    }

    /// Per-kernel profiling (every launch timed; decode steps are then not replayed as graphs).
    pub fn set_profiling(&mut self, on: bool) {
        let g = &mut self.0.ops.g;
        if on && g.prof.is_none() {
            g.prof = Some(crate::gpu::Profiler::new());
        } else if !on {
            g.prof = None;
        }
    }

    /// Same contract as `Stage::forward`.
    pub fn forward(&mut self, kv: &mut KvState, tokens: &[u32], hidden_in: Option<&[f32]>, want: ds4_model::Logits) -> ds4_model::Result<&[f32]> {
        self.0.forward(kv, tokens, hidden_in, want).map_err(ge)
    }

    /// Greedy top-1 of the last logits row and its log-probability, computed on the device.
    pub fn forward_argmax(&mut self, kv: &mut KvState, tokens: &[u32], hidden_in: Option<&[f32]>) -> ds4_model::Result<(u32, f32)> {
        self.0.forward_argmax(kv, tokens, hidden_in).map_err(ge)
    }

    /// The logits row of the last forward call that asked for the last row, downloaded.
    pub fn last_logits(&mut self) -> ds4_model::Result<&[f32]> { self.0.last_logits().map_err(ge) }

    /// Feeds `tokens` and returns every row's greedy pick (`GpuStage::forward_picks`).
    pub fn forward_picks(&mut self, kv: &mut KvState, tokens: &[u32]) -> ds4_model::Result<&[(u32, f32)]> { self.0.forward_picks(kv, tokens).map_err(ge) }

    /// Logits row `row` of the last forward call, downloaded.
    pub fn logits_row(&mut self, row: usize) -> ds4_model::Result<&[f32]> { self.0.logits_row(row).map_err(ge) }

    /// The HC streams after the last forward call (n × hc_dim), downloaded.
    pub fn hidden(&mut self, n: usize) -> ds4_model::Result<&[f32]> { self.0.hidden(n).map_err(ge) }

    /// One decode step for several sessions, each in its own KV slot (`GpuStage::forward_batch`): one
    /// logits row per session. Rows are bit-identical to decoding alone in batches of up to
    /// `EXACT_BATCH_ROWS` sessions, and in any batch with exact batches (`CudaOps::set_exact_batches`,
    /// the deterministic mode); larger batches by default use the multi-token kernels (weights read
    /// once per batch), which round differently.
    /// A batch of one session is its decode step (that slot's CUDA graph), not a one-row batch.
    pub fn forward_batch(&mut self, kvs: &mut [&mut KvState], tokens: &[u32]) -> ds4_model::Result<&[f32]> {
        match (kvs, tokens) {
            ([kv], [_]) => self.0.forward(kv, tokens, None, ds4_model::Logits::Last).map_err(ge),
            (kvs, tokens) => self.0.forward_batch(kvs, tokens).map_err(ge),
        }
    }

    /// Copies the device KV state of this stage's layers into `kv` (at the device's position or its snapshot's).
    pub fn download_kv(&mut self, kv: &mut KvState) -> ds4_model::Result<()> { self.0.download_kv(kv).map_err(ge) }

    /// Makes `kv` the device state; the next forward call continues from `kv.pos`.
    pub fn upload_kv(&mut self, kv: &KvState) -> ds4_model::Result<()> { self.0.upload_kv(kv).map_err(ge) }
}

/// Blocks of the greedy argmax over a logits row (`argmax_row`).
const ARGMAX_BLOCKS: u32 = 128;
/// Ints of one pick in `top1` (result, then the blocks' parts and the ticket); a verify step's row r
/// picks into the r-th.
const TOP1_INTS: usize = 3 + 3 * ARGMAX_BLOCKS as usize;

const GIB: f64 = (1u64 << 30) as f64;
