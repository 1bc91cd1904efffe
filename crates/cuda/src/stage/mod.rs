//! `CudaStage`: the forward pass of a stage on the GPU, with the CPU `Stage::forward` signature.
//! All weights are uploaded once at construction; KV state and work buffers are allocated once from the
//! memory plan's sizes (batch `nmax` = the prefill chunk, context `ctx`); a forward call then performs no
//! device allocation and no weight transfer (only the token ids in and the logits out).
use crate::gpu::{DBuf, Gpu, Result, A, ALLOCS, WEIGHT_UPLOADS};
pub use crate::host_pin::WeightPlace;
use crate::matvec::{cdiv, DM};
use ds4_gguf::GgmlType;
use ds4_model::{Config, KvState, LayerRange, Logits, ModelError, Options, Stage};
use std::sync::atomic::Ordering;

/// Batches at least this large go through dequantize-to-f16 + cuBLAS instead of the mat-vec kernels.
const GEMM_MIN: usize = 16;

mod attention;
mod blocks;
mod build;
mod ffn;
mod graph;
pub(super) mod host_time;
mod kv_io;

pub use build::GpuPlan;

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
}

struct Work {
    x: DBuf,
    flat: DBuf,
    mix: DBuf,
    mixes: DBuf,
    cur: DBuf,
    xn: DBuf,
    qr: DBuf,
    /// The normalised qr of one token for the indexer (decode, when q_b normalises qr itself).
    qrn: DBuf,
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
    /// Slice records and ticket of the fused decode sub-layer entry (`hc_pre_dec`).
    hcd_part: DBuf,
    hcd_ticket: DBuf,
    /// Tile list of the grouped expert GEMM (`gptr_cap` tiles of 4 ints).
    gptrs: DBuf,
    gptr_cap: usize,
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

/// Which int8 copies of the sub-layer input the entry kernel wrote (consumed by the products after it).
#[derive(Clone, Copy, Default)]
struct XnCopies {
    q80: bool,
    q8k: bool,
    /// The entry kernel also routed the token (eids / ew written).
    routed: bool,
}

/// Counters of what the device did since the last reset.
#[derive(Debug, Clone, Copy, Default)]
pub struct CudaStats {
    pub device_allocs: u64,
    pub weight_uploads: u64,
}

pub struct CudaStage {
    pub cfg: Config,
    opts: Options,
    range: LayerRange,
    embed: Option<DM>,
    layers: Vec<DLayer>,
    head: Option<DHead>,
    kv: Vec<DKv>,
    wk: Work,
    nmax: usize,
    ctx: usize,
    dev_pos: usize,
    snap_pos: Option<usize>,
    logits_host: Vec<f32>,
    hidden_host: Vec<f32>,
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
    /// When set, the HC streams after every layer of each forward call are appended here (as the CPU
    /// `Stage::trace`), for layer-by-layer comparison.
    pub trace: Option<Vec<Vec<f32>>>,
    /// Batches at least this large use dequantize + f16 cuBLAS GEMMs (DS4_CUDA_GEMM_MIN overrides;
    /// a huge value keeps every product on the f32 mat-vec kernels).
    pub gemm_min: usize,
    /// Heads per block of the tensor-core prefill attention (64 or 32; 0 = the f32 kernels);
    /// DS4_CUDA_ATTN_TC overrides.
    pub attn_tc_heads: usize,
    /// Prefill expert GEMMs as one grouped launch per matrix kind (`moe_gemm`; DS4_CUDA_GROUPED=0: one
    /// cuBLAS GEMM per expert over the side streams).
    pub grouped_gemm: bool,
    /// The grouped expert GEMM reads IQ2_XXS / Q2_K blocks as stored instead of f16 copies made by a
    /// dequantization pass (DS4_CUDA_GROUPED_QUANT=0 turns that off).
    pub grouped_quant: bool,
    /// Dense prefill products of 128..512 rows on the tensor-core tile kernel instead of cuBLAS
    /// (DS4_CUDA_DENSE_TC=0: cuBLAS).
    pub dense_tc: bool,
    /// Decode routed experts (Q2_K, IQ2_XXS) take int8 activations (Q8_K) as the CPU's
    /// `Precision::Fast` does; `Precision::Exact` keeps f32 activations (DS4_CUDA_FAST=0 forces that).
    pub fast_experts: bool,
    /// One-token split-Q8_0 products take Q8_0 activations (the CPU's `Precision::Fast`).
    pub fast_q8: bool,
    /// Decode sub-layer entry as one fused launch (`hc_pre_dec`; DS4_CUDA_HC_DEC=0: mat-vec + hc_pre_norm).
    pub hc_dec: bool,
    /// Decode: a sub-layer's exit (hc_post / moe_combine_post) is left pending and done by the next
    /// sub-layer's entry kernel (`hc_entry_dec`, every block finishing its columns) instead
    /// (DS4_CUDA_HC_FOLD=0: the exit kernels and hc_pre_dec).
    pub hc_fold: bool,
    /// With `hc_fold`, the FFN entry kernel also computes the gate logits and routes the token
    /// (DS4_CUDA_ROUTE_FOLD=0: `gate_route_dec` after it).
    pub route_fold: bool,
    /// The exit the streams in `x` still owe (decode with `hc_fold`), applied by the next entry or by
    /// [`CudaStage::flush_exit`].
    pend: Option<PendingExit>,
    /// The router arguments the next decode entry kernel takes (set by the FFN sub-layer for
    /// `hc_entry_dec`, which then also computes the gate logits and routes the token).
    entry_route: Option<[A; 12]>,
    /// Single-token forward calls read the position from `dpos` on the device, so one launch sequence
    /// serves every position and can be replayed as a CUDA graph.
    decode_mode: bool,
    dpos: DBuf,
    /// Captured decode graphs, by (hidden input, logits wanted); DS4_CUDA_GRAPH=0 turns them off.
    graphs: [Option<DecodeGraph>; 6],
    /// The forward call in progress is `forward_argmax`'s: a decode graph also takes the argmax
    /// (reset to false by the graph path once it has).
    want_top1: bool,
    pub use_graphs: bool,
    host_time: host_time::HostTime,
    /// Last: dropped after every device buffer above.
    g: Gpu,
}

// SAFETY: the raw CUDA handles a stage owns (stream, module, functions, cuBLAS handle, events, graphs,
// device pointers) belong to its context, which every public entry point binds to the calling thread
// first; `&mut self` makes the use exclusive. This lets a server build the stage on one thread and run
// it on its worker thread.
unsafe impl Send for CudaStage {}

impl Drop for CudaStage {
    fn drop(&mut self) {
        // The device buffers are freed right after this, possibly on another thread than the one that
        // built the stage: make the context current here.
        let _ = self.g.bind();
    }
}

pub(crate) fn me(s: String) -> ModelError { ModelError::Invalid(format!("cuda: {s}")) }

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
    pub fn new(stage: &Stage, ctx: usize, nmax: usize) -> ds4_model::Result<Self> {
        Self::build(stage, ctx, nmax.max(1), stage.w.range, 0, WeightPlace::Device).map_err(me)
    }

    /// [`CudaStage::new`] with the weights in `place`.
    pub fn new_placed(stage: &Stage, ctx: usize, nmax: usize, place: WeightPlace) -> ds4_model::Result<Self> {
        Self::build(stage, ctx, nmax.max(1), stage.w.range, 0, place).map_err(me)
    }

    /// The layers `part` of `stage` on CUDA device `device`: one of several stages of a pipeline over
    /// GPUs (each owns its layers' weights and KV; the hidden state passes between them).
    pub fn new_part(stage: &Stage, ctx: usize, nmax: usize, part: LayerRange, device: usize) -> ds4_model::Result<Self> {
        Self::build(stage, ctx, nmax.max(1), part, device, WeightPlace::Device).map_err(me)
    }

    /// [`CudaStage::new_part`] with the weights in `place`. With [`WeightPlace::Host`] the stage reads
    /// `stage`'s mapped weights while it runs: `stage` must outlive it.
    pub fn new_part_placed(stage: &Stage, ctx: usize, nmax: usize, part: LayerRange, device: usize, place: WeightPlace) -> ds4_model::Result<Self> {
        Self::build(stage, ctx, nmax.max(1), part, device, place).map_err(me)
    }

    /// The layers this stage runs.
    pub fn layers(&self) -> LayerRange { self.range }


    /// Device allocations and weight uploads so far (process-wide counters).
    pub fn stats() -> CudaStats {
        CudaStats { device_allocs: ALLOCS.load(Ordering::Relaxed), weight_uploads: WEIGHT_UPLOADS.load(Ordering::Relaxed) }
    }

    pub fn device_name(&self) -> &str { &self.g.name }

    /// Per-kernel CUDA-event profile since the last report (DS4_CUDA_PROFILE=1), or None.
    pub fn profile_report(&mut self) -> Option<String> {
        self.g.bind().ok()?;
        self.g.prof_report()
    }

    pub fn set_profiling(&mut self, on: bool) {
        if on && self.g.prof.is_none() {
            self.g.prof = Some(crate::gpu::Profiler::new());
        } else if !on {
            self.g.prof = None;
        }
    }

    fn reset_state(&mut self) -> Result<()> {
        for k in 0..self.kv.len() {
            let (a, b, n) = match (&self.kv[k].st_kv, &self.kv[k].st_sc) {
                (Some(a), Some(b)) => (a.ptr, b.ptr, self.kv[k].st_len),
                _ => continue,
            };
            self.g.launch("comp_reset", (cdiv(n, 256), 1, 1), 256, 0, &[A::P(a), A::P(b), A::I(n as i32)])?;
            if let (Some(a), Some(b)) = (&self.kv[k].ist_kv, &self.kv[k].ist_sc) {
                let (a, b, n) = (a.ptr, b.ptr, self.kv[k].ist_len);
                self.g.launch("comp_reset", (cdiv(n, 256), 1, 1), 256, 0, &[A::P(a), A::P(b), A::I(n as i32)])?;
            }
        }
        self.dev_pos = 0;
        Ok(())
    }

    fn snapshot(&mut self, restore: bool) -> Result<()> {
        let d = self.cfg.head_dim;
        for l in &self.kv {
            let mut off = 0u64;
            let mut parts: Vec<(u64, usize)> = vec![(l.ring.ptr, self.cfg.swa * d)];
            for (b, n) in [(&l.st_kv, l.st_len), (&l.st_sc, l.st_len), (&l.ist_kv, l.ist_len), (&l.ist_sc, l.ist_len)] {
                if let Some(b) = b {
                    parts.push((b.ptr, n));
                }
            }
            for (p, n) in parts {
                if restore {
                    self.g.dtod(p, l.snap.ptr + off, n * 4)?;
                } else {
                    self.g.dtod(l.snap.ptr + off, p, n * 4)?;
                }
                off += 4 * n as u64;
            }
        }
        Ok(())
    }

    /// Brings the device state to `pos` (0 = fresh, the current position, or the last snapshot).
    fn sync_state(&mut self, pos: usize) -> Result<()> {
        if pos == 0 {
            if self.dev_pos != 0 {
                self.reset_state()?;
            }
            return Ok(());
        }
        if pos == self.dev_pos {
            return Ok(());
        }
        if self.snap_pos == Some(pos) {
            self.snapshot(true)?;
            self.dev_pos = pos;
            return Ok(());
        }
        Err(format!("the KV state at position {pos} is not on the device (device at {}, snapshot at {:?})", self.dev_pos, self.snap_pos))
    }

    /// The HC streams after the last forward call (n × hc_dim), downloaded.
    pub fn hidden(&mut self, n: usize) -> ds4_model::Result<&[f32]> {
        self.g.bind().map_err(me)?;
        let hd = self.cfg.hc_dim();
        self.hidden_host.resize(n * hd, 0.0);
        let p = self.wk.x.ptr;
        self.g.dtoh(&mut self.hidden_host, p).map_err(me)?;
        Ok(&self.hidden_host)
    }

    /// Greedy top-1 of the last logits row and its log-probability, computed on the device (8 bytes
    /// back instead of the row; in a one-token step the argmax is a node of the decode graph). The
    /// logits stay on the device for [`CudaStage::last_logits`].
    pub fn forward_argmax(&mut self, kv: &mut KvState, tokens: &[u32], hidden_in: Option<&[f32]>) -> ds4_model::Result<(u32, f32)> {
        self.g.bind().map_err(me)?;
        self.host_time.call(tokens.len() == 1);
        self.want_top1 = true;
        let r = self.forward_dev(kv, tokens, hidden_in, Logits::Last);
        // Still set unless a decode graph took the argmax.
        let not_taken = std::mem::replace(&mut self.want_top1, false);
        if r.map_err(me)? == 0 {
            return Err(me("the stage has no output head".into()));
        }
        let tp = self.wk.top1.ptr;
        if not_taken {
            let v = self.cfg.n_vocab;
            let lp = self.wk.logits.ptr;
            self.g.launch("argmax_row", (ARGMAX_BLOCKS, 1, 1), 256, 0, &[A::P(lp), A::I(v as i32), A::P(tp)]).map_err(me)?;
        }
        let mut top = [0i32; 2];
        let t = self.host_time.now();
        self.g.sync().map_err(me)?;
        self.host_time.add_wait(t);
        self.g.dtoh(&mut top, tp).map_err(me)?;
        Ok((top[0] as u32, f32::from_bits(top[1] as u32)))
    }

    /// The logits row of the last forward call that asked for the last row (e.g. after
    /// [`CudaStage::forward_argmax`]), downloaded.
    pub fn last_logits(&mut self) -> ds4_model::Result<&[f32]> {
        self.g.bind().map_err(me)?;
        let v = self.cfg.n_vocab;
        self.logits_host.resize(v, 0.0);
        let p = self.wk.logits.ptr;
        self.g.dtoh(&mut self.logits_host, p).map_err(me)?;
        Ok(&self.logits_host)
    }

    /// Same contract as `Stage::forward`.
    pub fn forward(&mut self, kv: &mut KvState, tokens: &[u32], hidden_in: Option<&[f32]>, want: Logits) -> ds4_model::Result<&[f32]> {
        self.g.bind().map_err(me)?;
        self.host_time.call(tokens.len() == 1);
        let rows = self.forward_dev(kv, tokens, hidden_in, want).map_err(me)?;
        let v = self.cfg.n_vocab;
        self.logits_host.resize(rows * v, 0.0);
        if rows > 0 {
            let p = self.wk.logits.ptr;
            let t = self.host_time.now();
            self.g.sync().map_err(me)?;
            self.host_time.add_wait(t);
            let t = self.host_time.now();
            self.g.dtoh(&mut self.logits_host, p).map_err(me)?;
            self.host_time.add_copy(t);
        } else {
            self.g.sync().map_err(me)?;
        }
        Ok(&self.logits_host)
    }

    /// Runs the forward pass, leaving logits rows on the device; returns the row count.
    fn forward_dev(&mut self, kv: &mut KvState, tokens: &[u32], hidden_in: Option<&[f32]>, want: Logits) -> Result<usize> {
        let n = tokens.len();
        if n == 0 {
            return Ok(0);
        }
        if n > self.nmax {
            return Err(format!("batch of {n} tokens exceeds the prefill chunk {} the buffers were sized for", self.nmax));
        }
        if kv.pos + n > kv.ctx || kv.pos + n > self.ctx {
            return Err(format!("context full: {} + {} tokens exceeds ctx {}", kv.pos, n, kv.ctx.min(self.ctx)));
        }
        if self.layers.iter().any(|l| l.tid2eid.is_some()) {
            if let Some(&t) = tokens.iter().find(|&&t| t as usize >= self.cfg.n_vocab) {
                return Err(format!("token id {t} is outside the vocabulary"));
            }
        }
        self.sync_state(kv.pos)?;
        // A call that failed part-way may have left an exit pending on streams that are now rewritten.
        self.pend = None;
        let pos0 = kv.pos;
        let hd = self.cfg.hc_dim();
        let tp = self.wk.tokens.ptr;
        self.g.htod(tp, tokens)?;
        let d = self.cfg.head_dim;
        self.decode_mode = n == 1 && d % 4 == 0 && d <= 1024;
        self.g.pdl_now = self.decode_mode;
        if self.decode_mode {
            let p = [pos0 as i64];
            self.g.htod(self.dpos.ptr, &p)?;
            if self.use_graphs && self.g.prof.is_none() && self.trace.is_none() {
                return self.decode_graph(kv, tokens, hidden_in, want);
            }
        }
        match (hidden_in, &self.embed) {
            (Some(h), _) => {
                if h.len() != n * hd {
                    return Err(format!("hidden input has {} floats, expected {}", h.len(), n * hd));
                }
                let xp = self.wk.x.ptr;
                self.g.htod(xp, h)?;
            }
            (None, Some(em)) => {
                if let Some(&t) = tokens.iter().find(|&&t| t as usize >= em.rows) {
                    return Err(format!("token id {t} is outside the vocabulary ({})", em.rows));
                }
                let (ep, ty) = (em.ptr, ty_code(em.ty));
                let args = [A::P(ep), A::I(ty), A::P(tp), A::P(self.wk.x.ptr), A::I(self.cfg.n_embd as i32), A::I(self.cfg.n_hc as i32)];
                self.g.launch("embed", (n as u32, cdiv(self.cfg.n_embd, 256), 1), 256, 0, &args)?;
            }
            (None, None) => return Err("stage without embedding needs a hidden-state input".into()),
        }
        for li in 0..self.layers.len() {
            self.attention(li, n, pos0)?;
            self.ffn(li, n)?;
            if self.trace.is_some() {
                self.flush_exit()?;
                let mut h = vec![0f32; n * hd];
                self.g.dtoh(&mut h, self.wk.x.ptr)?;
                self.trace.as_mut().unwrap().push(h);
            }
        }
        self.flush_exit()?;
        kv.pos += n;
        self.dev_pos = kv.pos;
        if n > 1 {
            self.snapshot(false)?;
            self.snap_pos = Some(kv.pos);
        }
        if want == Logits::None || self.head.is_none() {
            return Ok(0);
        }
        let (r0, m) = if want == Logits::Last { (n - 1, 1) } else { (0, n) };
        self.head_fwd(r0, m)?;
        Ok(m)
    }

}

/// Blocks of the greedy argmax over a logits row (`argmax_row`; `top1` holds 3 + 3 x this many ints).
const ARGMAX_BLOCKS: u32 = 128;

const GIB: f64 = (1u64 << 30) as f64;
