//! `CudaStage`: the forward pass of a stage on the GPU, with the CPU `Stage::forward` signature.
//! All weights are uploaded once at construction; KV state and work buffers are allocated once from the
//! memory plan's sizes (batch `nmax` = the prefill chunk, context `ctx`); a forward call then performs no
//! device allocation and no weight transfer (only the token ids in and the logits out).
use crate::gpu::{DBuf, Gpu, Result, A, ALLOCS, WEIGHT_UPLOADS};
use ds4_gguf::GgmlType;
use ds4_model::kv::{compressed_capacity, compressor_rows};
use ds4_model::rope::Rope;
use ds4_model::weights::{CompressorWeights, HcWeights, Mat};
use ds4_model::{residency, Config, KvState, LayerRange, Logits, ModelError, Options, Stage};
use std::sync::atomic::Ordering;

/// Batches at least this large go through dequantize-to-f16 + cuBLAS instead of the mat-vec kernels.
const GEMM_MIN: usize = 16;

#[derive(Clone, Copy)]
struct DM {
    ptr: u64,
    ty: GgmlType,
    rows: usize,
    cols: usize,
    n_mat: usize,
    row_bytes: usize,
    /// Rows converted to the split layout (block payloads, then scales) by `split_rows` at load.
    split: bool,
}

impl DM {
    fn mat_bytes(&self) -> usize { self.rows * self.row_bytes }
}

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
    q: DBuf,
    kvb: DBuf,
    ck: DBuf,
    cg: DBuf,
    pooled: DBuf,
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
    pub weight_bytes: u64,
    pub upload_secs: f64,
    /// When set, the HC streams after every layer of each forward call are appended here (as the CPU
    /// `Stage::trace`), for layer-by-layer comparison.
    pub trace: Option<Vec<Vec<f32>>>,
    /// Batches at least this large use dequantize + f16 cuBLAS GEMMs (DS4_CUDA_GEMM_MIN overrides;
    /// a huge value keeps every product on the f32 mat-vec kernels).
    pub gemm_min: usize,
    /// Single-token forward calls read the position from `dpos` on the device, so one launch sequence
    /// serves every position and can be replayed as a CUDA graph.
    decode_mode: bool,
    dpos: DBuf,
    /// Captured decode graphs, by (hidden input, logits wanted); DS4_CUDA_GRAPH=0 turns them off.
    graphs: [Option<DecodeGraph>; 4],
    pub use_graphs: bool,
    /// Last: dropped after every device buffer above.
    g: Gpu,
}

/// An instantiated CUDA graph of one decode step.
struct DecodeGraph {
    graph: cudarc::driver::sys::CUgraph,
    exec: cudarc::driver::sys::CUgraphExec,
}

impl Drop for DecodeGraph {
    fn drop(&mut self) {
        // SAFETY: both handles were created by capture/instantiate and are destroyed once.
        unsafe {
            let _ = cudarc::driver::result::graph::exec_destroy(self.exec);
            let _ = cudarc::driver::result::graph::destroy(self.graph);
        }
    }
}

fn me(s: String) -> ModelError { ModelError::Invalid(format!("cuda: {s}")) }

fn ty_code(t: GgmlType) -> i32 {
    match t {
        GgmlType::F32 => 0,
        GgmlType::F16 => 1,
        GgmlType::Q8_0 => 8,
        GgmlType::BF16 => 30,
        _ => -1,
    }
}

fn mv_name(t: GgmlType, nt4: bool) -> Result<&'static str> {
    Ok(match (t, nt4) {
        (GgmlType::Q8_0, false) => "mv_q8_0_n1",
        (GgmlType::Q8_0, true) => "mv_q8_0_n4",
        (GgmlType::Q2_K, false) => "mv_q2_k_n1",
        (GgmlType::Q2_K, true) => "mv_q2_k_n4",
        (GgmlType::Q4_K, false) => "mv_q4_k_n1",
        (GgmlType::Q4_K, true) => "mv_q4_k_n4",
        (GgmlType::IQ2_XXS, false) => "mv_iq2_xxs_n1",
        (GgmlType::IQ2_XXS, true) => "mv_iq2_xxs_n4",
        (GgmlType::F16, false) => "mv_f16_n1",
        (GgmlType::F16, true) => "mv_f16_n4",
        (GgmlType::BF16, false) => "mv_bf16_n1",
        (GgmlType::BF16, true) => "mv_bf16_n4",
        (GgmlType::F32, false) => "mv_f32_n1",
        (GgmlType::F32, true) => "mv_f32_n4",
        (t, _) => return Err(format!("no CUDA mat-vec for {}", t.name())),
    })
}

fn dq_name(t: GgmlType) -> Result<&'static str> {
    Ok(match t {
        GgmlType::Q8_0 => "dq_q8_0",
        GgmlType::Q2_K => "dq_q2_k",
        GgmlType::Q4_K => "dq_q4_k",
        GgmlType::IQ2_XXS => "dq_iq2_xxs",
        GgmlType::BF16 => "dq_bf16",
        GgmlType::F32 => "dq_f32",
        t => return Err(format!("no CUDA dequantization for {}", t.name())),
    })
}

/// Warps per output row of the mat-vec kernel: split K when there are too few rows to fill the GPU.
fn ks(total_rows: usize) -> usize {
    if total_rows < 4096 { 8 } else if total_rows < 16384 { 2 } else { 1 }
}

/// Elements one thread of a dequantization kernel writes.
fn dq_unit(t: GgmlType) -> usize {
    if matches!(t, GgmlType::Q2_K | GgmlType::IQ2_XXS) { 8 } else { 32 }
}

fn cdiv(a: usize, b: usize) -> u32 { a.div_ceil(b) as u32 }

/// Row-tiled mat-vec kernel (kernels.cu "mv4") for `m`, when its type and layout have one.
fn mv4_name(m: &DM, nt4: bool) -> Option<&'static str> {
    let base = match m.ty {
        GgmlType::F16 if m.cols % 4 == 0 => 0,
        GgmlType::Q8_0 if m.split => 1,
        GgmlType::Q2_K => 2,
        GgmlType::Q4_K => 3,
        GgmlType::IQ2_XXS if m.split => 4,
        _ => return None,
    };
    const N: [[&str; 2]; 5] = [["mv4_f16_n1", "mv4_f16_n4"], ["mv4_q8s_n1", "mv4_q8s_n4"], ["mv4_q2_k_n1", "mv4_q2_k_n4"], ["mv4_q4_k_n1", "mv4_q4_k_n4"], ["mv4_iq2s_n1", "mv4_iq2s_n4"]];
    Some(N[base][nt4 as usize])
}

/// Warps sharing one 4-row group of the mv4 kernel: split K until about 4096 warps are busy.
fn ks4(rows: usize, cols: usize, z: usize) -> usize {
    let groups = rows.div_ceil(4) * z;
    let chunks = cols.div_ceil(256);
    let mut ks = 1;
    while ks < 8 && groups * ks < 4096 && ks * 2 <= chunks {
        ks *= 2;
    }
    ks
}

/// y = x·Wᵀ over `n` tokens for `z` matrix slots (MV_ARGS in kernels.cu).
#[allow(clippy::too_many_arguments)]
fn launch_mv(g: &mut Gpu, m: &DM, w: u64, w_mat_bytes: usize, eids: u64, x: u64, ldx: usize, x_z: usize, y: u64, ldy: usize, y_z: usize, rows: usize, n: usize, z: usize) -> Result<()> {
    let nt4 = n > 1;
    let nt = if nt4 { 4 } else { 1 };
    if n == 1 && ((m.ty == GgmlType::IQ2_XXS && m.split && m.cols % 1024 == 0 && m.cols <= 32768) || (m.ty == GgmlType::Q2_K && m.cols % 512 == 0)) {
        return launch_mvq(g, m, w, w_mat_bytes, eids, x, x_z, y, y_z, rows, z);
    }
    let (name, ks, rows_per_block) = match mv4_name(m, nt4) {
        Some(name) => {
            let ks = ks4(rows, m.cols, z);
            (name, ks, 4 * (8 / ks))
        }
        None => {
            if m.split {
                return Err(format!("no mat-vec kernel for split-layout {}", m.ty.name()));
            }
            let ks = ks(rows * z);
            (mv_name(m.ty, nt4)?, ks, 8 / ks)
        }
    };
    let args = [
        A::P(w),
        A::P(w_mat_bytes as u64),
        A::P(eids),
        A::P(x),
        A::I(ldx as i32),
        A::I(x_z as i32),
        A::P(y),
        A::I(ldy as i32),
        A::I(y_z as i32),
        A::I(rows as i32),
        A::I(m.cols as i32),
        A::I(n as i32),
        A::I(ks as i32),
    ];
    g.launch(name, (cdiv(rows, rows_per_block), cdiv(n, nt), z as u32), 256, 0, &args)
}

/// One-token IQ2_XXS / Q2_K mat-vec through `mvq_*_n1` (8 rows per warp; IQ2 activations in shared memory).
#[allow(clippy::too_many_arguments)]
fn launch_mvq(g: &mut Gpu, m: &DM, w: u64, w_mat_bytes: usize, eids: u64, x: u64, x_z: usize, y: u64, y_z: usize, rows: usize, z: usize) -> Result<()> {
    const R: usize = 8;
    let iq2 = m.ty == GgmlType::IQ2_XXS;
    // Steps per row: IQ2 lanes take 32-value groups (1024 values a step), Q2_K 2 superblocks a step.
    let steps = if iq2 { (m.cols / 256 * 8).div_ceil(32) } else { (m.cols / 256).div_ceil(2) };
    let warps = rows.div_ceil(R) * z;
    let mut ks = 1;
    while ks < 8 && warps * ks < 4096 && ks * 2 <= steps {
        ks *= 2;
    }
    let args = [
        A::P(w),
        A::P(w_mat_bytes as u64),
        A::P(eids),
        A::P(x),
        A::I(m.cols as i32),
        A::I(x_z as i32),
        A::P(y),
        A::I(rows as i32),
        A::I(y_z as i32),
        A::I(rows as i32),
        A::I(m.cols as i32),
        A::I(1),
        A::I(ks as i32),
    ];
    let (name, smem) = if iq2 { ("mvq_iq2s_n1", (m.cols * 4) as u32) } else { ("mvq_q2_k_n1", 0) };
    g.launch(name, (cdiv(rows, R * (8 / ks)), 1, z as u32), 256, smem, &args)
}

/// f16 copy of `elems` elements of `m` starting at `src` (whole rows).
fn launch_dq(g: &mut Gpu, m: &DM, src: u64, dst: u64, elems: usize) -> Result<()> {
    if m.split {
        let (name, unit) = match m.ty {
            GgmlType::Q8_0 => ("dq_q8s", 32),
            GgmlType::IQ2_XXS => ("dq_iq2s", 8),
            t => return Err(format!("no split-layout dequantization for {}", t.name())),
        };
        return g.launch(name, (cdiv(elems / unit, 256), 1, 1), 256, 0, &[A::P(src), A::P(dst), A::P(elems as u64), A::I(m.cols as i32)]);
    }
    let name = dq_name(m.ty)?;
    g.launch(name, (cdiv(elems / dq_unit(m.ty), 256), 1, 1), 256, 0, &[A::P(src), A::P(dst), A::P(elems as u64)])
}

/// Converts a Q8_0 / IQ2_XXS matrix (stack) in place to the split row layout the mv4 kernels read.
fn split_layout(g: &mut Gpu, m: &mut DM) -> Result<()> {
    let (bs, unit) = match m.ty {
        GgmlType::Q8_0 => (34usize, 32usize),
        GgmlType::IQ2_XXS => (66, 256),
        _ => return Ok(()),
    };
    let nb = m.cols / unit;
    if m.split || nb % 2 != 0 || m.row_bytes > 48 * 1024 {
        return Ok(());
    }
    let nrows = m.rows * m.n_mat.max(1);
    // Grid x is limited to 2^31-1 blocks; launch in slices of rows.
    let mut r0 = 0usize;
    while r0 < nrows {
        let cnt = (nrows - r0).min(1 << 30);
        let p = m.ptr + (r0 * m.row_bytes) as u64;
        g.launch("split_rows", (cnt as u32, 1, 1), 256, m.row_bytes as u32, &[A::P(p), A::I(nb as i32), A::I(bs as i32)])?;
        r0 += cnt;
    }
    m.split = true;
    Ok(())
}

/// Weight upload plan: device buffers and the host bytes that go into them.
struct Uploader<'a> {
    g: &'a Gpu,
    bufs: Vec<DBuf>,
    items: Vec<(u64, &'a [u8])>,
    bytes: u64,
    owned: Vec<Vec<u8>>,
}

impl<'a> Uploader<'a> {
    fn bytes(&mut self, data: &'a [u8]) -> Result<u64> {
        let b = self.g.alloc(data.len())?;
        let p = b.ptr;
        self.items.push((p, data));
        self.bytes += data.len() as u64;
        self.bufs.push(b);
        Ok(p)
    }
    /// Small host vectors (norms, biases) are copied immediately.
    fn vec_f32(&mut self, v: &[f32]) -> Result<u64> {
        let b = self.g.alloc(v.len() * 4)?;
        self.g.htod(b.ptr, v)?;
        WEIGHT_UPLOADS.fetch_add(1, Ordering::Relaxed);
        let p = b.ptr;
        self.bufs.push(b);
        self.bytes += 4 * v.len() as u64;
        Ok(p)
    }
    fn vec_u32(&mut self, v: &[u32]) -> Result<u64> {
        let b = self.g.alloc(v.len() * 4)?;
        self.g.htod(b.ptr, v)?;
        WEIGHT_UPLOADS.fetch_add(1, Ordering::Relaxed);
        let p = b.ptr;
        self.bufs.push(b);
        Ok(p)
    }
    fn vec_f64(&mut self, v: &[f64]) -> Result<u64> {
        let b = self.g.alloc(v.len() * 8)?;
        self.g.htod(b.ptr, v)?;
        let p = b.ptr;
        self.bufs.push(b);
        Ok(p)
    }
}

impl CudaStage {
    /// Uploads the weights of `stage` (its bound, mapped tensors) and allocates KV state for `ctx` and
    /// work buffers for batches of up to `nmax` tokens.
    pub fn new(stage: &Stage, ctx: usize, nmax: usize) -> ds4_model::Result<Self> {
        Self::build(stage, ctx, nmax.max(1)).map_err(me)
    }

    fn build(stage: &Stage, ctx: usize, nmax: usize) -> Result<Self> {
        let cfg = stage.cfg.clone();
        let w = &stage.w;
        let mut g = Gpu::new(&ds4_quant::iq2xxs_tables::IQ2XXS_GRID_CONST)?;
        let (free, total) = cudarc::driver::result::mem_get_info().map_err(|e| format!("{e:?}"))?;
        eprintln!("cuda: {} ({}, {} SMs), {:.1} GiB free of {:.1} GiB", g.name, g.arch, g.sms, free as f64 / GIB, total as f64 / GIB);
        let need = w.resident_bytes();
        if need as f64 > free as f64 * 0.97 {
            return Err(format!(
                "the stage's weights ({:.1} GiB) do not fit in the GPU's free memory ({:.1} GiB): serve fewer layers with --layers",
                need as f64 / GIB,
                free as f64 / GIB
            ));
        }
        let mut up = Uploader { g: &g, bufs: Vec::new(), items: Vec::new(), bytes: 0, owned: Vec::new() };
        let _ = &up.owned;
        fn dm<'a>(up: &mut Uploader<'a>, w: &'a ds4_model::Weights, m: &Mat) -> Result<DM> {
            let r = w.mat(m);
            if matches!(m.ty, GgmlType::F16 | GgmlType::BF16) && m.cols % 8 != 0 {
                return Err(format!("F16 matrix with {} columns (need a multiple of 8)", m.cols));
            }
            let ptr = up.bytes(r.data)?;
            let row_bytes = m.ty.row_bytes(m.cols).ok_or("bad row")?;
            Ok(DM { ptr, ty: m.ty, rows: m.rows, cols: m.cols, n_mat: m.n_mat, row_bytes, split: false })
        }
        fn hc<'a>(up: &mut Uploader<'a>, w: &'a ds4_model::Weights, h: &HcWeights) -> Result<DHc> {
            Ok(DHc { fn_: dm(up, w, &h.fn_)?, scale: up.vec_f32(&h.scale)?, base: up.vec_f32(&h.base)? })
        }
        fn comp<'a>(up: &mut Uploader<'a>, w: &'a ds4_model::Weights, c: &CompressorWeights) -> Result<DComp> {
            Ok(DComp { ape: up.vec_f32(&c.ape)?, kv: dm(up, w, &c.kv)?, gate: dm(up, w, &c.gate)?, norm: up.vec_f32(&c.norm)? })
        }
        residency::set_phase(residency::Phase::Load);
        let embed = match &w.embed {
            Some(m) => {
                if ty_code(m.ty) < 0 {
                    return Err(format!("embedding type {} not supported on CUDA", m.ty.name()));
                }
                Some(dm(&mut up, w, m)?)
            }
            None => None,
        };
        let mut layers = Vec::new();
        for l in &w.layers {
            let rope = Rope::for_layer(&cfg, cfg.ratio(l.il));
            let dl = DLayer {
                ratio: cfg.ratio(l.il),
                freqs: up.vec_f64(rope.freqs())?,
                hc_attn: hc(&mut up, w, &l.hc_attn)?,
                attn_norm: up.vec_f32(&l.attn_norm)?,
                q_a: dm(&mut up, w, &l.q_a)?,
                q_a_norm: up.vec_f32(&l.q_a_norm)?,
                q_b: dm(&mut up, w, &l.q_b)?,
                kv: dm(&mut up, w, &l.kv)?,
                kv_norm: up.vec_f32(&l.kv_norm)?,
                sinks: up.vec_f32(&l.sinks)?,
                out_a: dm(&mut up, w, &l.out_a)?,
                out_b: dm(&mut up, w, &l.out_b)?,
                comp: match &l.comp {
                    Some(c) => Some(comp(&mut up, w, c)?),
                    None => None,
                },
                indexer: match &l.indexer {
                    Some(i) => Some(DIdx { q_b: dm(&mut up, w, &i.q_b)?, proj: dm(&mut up, w, &i.proj)?, comp: comp(&mut up, w, &i.comp)? }),
                    None => None,
                },
                hc_ffn: hc(&mut up, w, &l.hc_ffn)?,
                ffn_norm: up.vec_f32(&l.ffn_norm)?,
                gate_inp: dm(&mut up, w, &l.gate_inp)?,
                exp_bias: match &l.exp_bias {
                    Some(b) => Some(up.vec_f32(b)?),
                    None => None,
                },
                tid2eid: match &l.tid2eid {
                    Some(t) => Some(up.vec_u32(t)?),
                    None => None,
                },
                gate_exps: dm(&mut up, w, &l.gate_exps)?,
                up_exps: dm(&mut up, w, &l.up_exps)?,
                down_exps: dm(&mut up, w, &l.down_exps)?,
                shared: match &l.shared {
                    Some([a, b, c]) => Some([dm(&mut up, w, a)?, dm(&mut up, w, b)?, dm(&mut up, w, c)?]),
                    None => None,
                },
                clamp: cfg.swiglu_clamp[l.il],
            };
            layers.push(dl);
        }
        let head = match &w.head {
            Some(h) => Some(DHead {
                hc_fn: dm(&mut up, w, &h.hc_fn)?,
                hc_scale: up.vec_f32(&h.hc_scale)?,
                hc_base: up.vec_f32(&h.hc_base)?,
                norm: up.vec_f32(&h.norm)?,
                output: dm(&mut up, w, &h.output)?,
            }),
            None => None,
        };
        // One pass of large copies through pinned staging buffers.
        let t0 = std::time::Instant::now();
        let total = up.bytes;
        let mut last = 0u64;
        let items = std::mem::take(&mut up.items);
        g.upload(&items, |done, tot| {
            if done * 20 / tot.max(1) != last * 20 / tot.max(1) || done == tot {
                eprint!("\rcuda: uploading weights {:5.1}% ({:.1} / {:.1} GiB)", 100.0 * done as f64 / tot as f64, done as f64 / GIB, tot as f64 / GIB);
                last = done;
            }
        })?;
        residency::count(residency::Op::Upload, items.len() as u64);
        let upload_secs = t0.elapsed().as_secs_f64();
        eprintln!("\ncuda: {:.2} GiB of weights resident in {:.1} s ({:.1} GB/s)", total as f64 / GIB, upload_secs, total as f64 / 1e9 / upload_secs.max(1e-9));
        let weights = std::mem::take(&mut up.bufs);
        drop(items);
        drop(up);
        // Q8_0 / IQ2_XXS rows to the split layout of the mv4 kernels (in place, once).
        let mut layers = layers;
        let mut head = head;
        for l in layers.iter_mut() {
            for m in l.mats_mut() {
                split_layout(&mut g, m)?;
            }
        }
        if let Some(h) = head.as_mut() {
            split_layout(&mut g, &mut h.hc_fn)?;
            split_layout(&mut g, &mut h.output)?;
        }
        g.sync()?;

        // KV state.
        let (d, id) = (cfg.head_dim, cfg.idx_dim);
        let mut kv = Vec::new();
        for (li, l) in layers.iter().enumerate() {
            let il = w.range.first + li;
            let ratio = l.ratio;
            let coff = cfg.compress_coff(il);
            let cap = compressed_capacity(ctx, ratio);
            let st_len = if ratio != 0 { compressor_rows(ratio) * coff * d } else { 0 };
            let ist_len = if l.indexer.is_some() { compressor_rows(ratio) * coff * id } else { 0 };
            let opt = |n: usize| -> Result<Option<DBuf>> { if n > 0 { Ok(Some(g.alloc_zeroed(n * 4)?)) } else { Ok(None) } };
            kv.push(DKv {
                ring: g.alloc_zeroed(cfg.swa * d * 4)?,
                comp: opt(if ratio != 0 { cap * d } else { 0 })?,
                st_kv: opt(st_len)?,
                st_sc: opt(st_len)?,
                st_len,
                idx: opt(if l.indexer.is_some() { cap * id } else { 0 })?,
                ist_kv: opt(ist_len)?,
                ist_sc: opt(ist_len)?,
                ist_len,
                snap: g.alloc_zeroed((cfg.swa * d + 2 * st_len + 2 * ist_len) * 4)?,
            });
        }

        // Work buffers for batches of up to nmax tokens.
        let n = nmax;
        let (e, hd, k, ff, ne) = (cfg.n_embd, cfg.hc_dim(), cfg.n_expert_used, cfg.ff_exp, cfg.n_expert);
        let f = |c: usize| g.alloc(c * 4);
        let cap4 = compressed_capacity(ctx, 4);
        let ldsc = cap4.max(1);
        let logit_rows = if head.is_some() { n } else { 1 };
        // f16 scratch: the largest matrix that may take the GEMM path, and the largest activation block.
        let mut wh_elems = 0usize;
        let mut max_cols = hd;
        for l in &layers {
            let mut ms = vec![l.hc_attn.fn_, l.q_a, l.q_b, l.kv, l.out_a, l.out_b, l.hc_ffn.fn_, l.gate_inp];
            if let Some(c) = &l.comp {
                ms.extend([c.kv, c.gate]);
            }
            if let Some(i) = &l.indexer {
                ms.extend([i.q_b, i.proj, i.comp.kv, i.comp.gate]);
            }
            if let Some(s) = &l.shared {
                ms.extend(s.iter().copied());
            }
            for m in ms.iter().chain([l.gate_exps, l.up_exps, l.down_exps].iter()) {
                if m.ty != GgmlType::F16 {
                    wh_elems = wh_elems.max(m.rows * m.cols);
                }
                max_cols = max_cols.max(m.cols);
            }
        }
        if let Some(h) = &head {
            max_cols = max_cols.max(h.hc_fn.cols);
        }
        let max_comp = layers
            .iter()
            .map(|l| if l.ratio != 0 { compressed_capacity(ctx, l.ratio).min(if l.indexer.is_some() { cfg.idx_topk } else { usize::MAX }) } else { 0 })
            .max()
            .unwrap_or(0);
        let adec_splits = (cfg.swa.min(ctx) + max_comp).div_ceil(32).max(1);
        let xh_elems = n * max_cols.max(k * e).max(k * ff).max(cfg.q_dim());
        let wk = Work {
            x: f(n * hd)?,
            flat: f(n * hd)?,
            mix: f(n * cfg.hc_mix().max(cfg.n_hc))?,
            mixes: f(n * (cfg.n_hc + cfg.n_hc * cfg.n_hc))?,
            cur: f(n * e)?,
            xn: f(n * e)?,
            qr: f(n * cfg.q_lora)?,
            q: f(n * cfg.q_dim())?,
            kvb: f(n * d)?,
            ck: f(n * 2 * d.max(id))?,
            cg: f(n * 2 * d.max(id))?,
            pooled: f((n / 4 + 2) * d.max(id))?,
            iq: f(n * cfg.idx_heads * id)?,
            iw: f(n * cfg.idx_heads)?,
            scores: f(n * ldsc)?,
            ldsc,
            sel: f(n * cfg.idx_topk)?,
            o: f(n * cfg.q_dim())?,
            low: f(n * cfg.o_groups * cfg.o_lora)?,
            y: f(n * e)?,
            rlog: f(n * ne)?,
            eids: f(n * k)?,
            ew: f(n * k)?,
            ex_a: f(n * k * ff)?,
            ex_b: f(n * k * ff)?,
            ex_out: f(n * k * e)?,
            gx: f(n * k * e)?,
            gw: f(n * k)?,
            gtok: f(n * k)?,
            slot_pos: f(n * k)?,
            counts: f(ne)?,
            cursor: f(ne)?,
            sh_a: f(n * ff)?,
            sh_b: f(n * ff)?,
            sh_out: f(n * e)?,
            logits: f(logit_rows * cfg.n_vocab)?,
            tokens: f(n)?,
            top1: f(1)?,
            adec: f(adec_splits * cfg.n_head * (d + 2))?,
            adec_splits,
            wh: g.alloc(wh_elems.max(1) * 2)?,
            wh_elems,
            xh: g.alloc(xh_elems * 2)?,
        };
        let dpos_buf = g.alloc(8)?;
        // Shared-memory limits of the decode kernels are raised now: a graph capture should only record launches.
        g.reserve_smem("attn_dec", ((8 * d + 32 * d + 8 * 32) * 4) as u32)?;
        g.reserve_smem("idx_scores", ((cfg.idx_heads * (id + 1) + 16 * id + 16 * 8) * 4) as u32)?;
        g.sync()?;
        let (free2, _) = cudarc::driver::result::mem_get_info().map_err(|e| format!("{e:?}"))?;
        eprintln!("cuda: KV + work buffers allocated (ctx {ctx}, batch {nmax}); {:.1} GiB free", free2 as f64 / GIB);
        let mut s = Self {
            cfg,
            g,
            opts: stage.opts,
            range: w.range,
            embed,
            layers,
            head,
            kv,
            wk,
            nmax,
            ctx,
            dev_pos: 0,
            snap_pos: None,
            logits_host: Vec::with_capacity(logit_rows * stage.cfg.n_vocab),
            hidden_host: Vec::new(),
            counts_host: vec![0; stage.cfg.n_expert],
            _weights: weights,
            weight_bytes: total,
            upload_secs,
            trace: None,
            gemm_min: std::env::var("DS4_CUDA_GEMM_MIN").ok().and_then(|v| v.parse().ok()).unwrap_or(GEMM_MIN),
            decode_mode: false,
            dpos: dpos_buf,
            graphs: [None, None, None, None],
            use_graphs: std::env::var("DS4_CUDA_GRAPH").map_or(true, |v| v != "0"),
        };
        s.reset_state()?;
        Ok(s)
    }

    /// Device allocations and weight uploads so far (process-wide counters).
    pub fn stats() -> CudaStats {
        CudaStats { device_allocs: ALLOCS.load(Ordering::Relaxed), weight_uploads: WEIGHT_UPLOADS.load(Ordering::Relaxed) }
    }

    pub fn device_name(&self) -> &str { &self.g.name }

    /// Per-kernel CUDA-event profile since the last report (DS4_CUDA_PROFILE=1), or None.
    pub fn profile_report(&mut self) -> Option<String> { self.g.prof_report() }

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
        let hd = self.cfg.hc_dim();
        self.hidden_host.resize(n * hd, 0.0);
        let p = self.wk.x.ptr;
        self.g.dtoh(&mut self.hidden_host, p).map_err(me)?;
        Ok(&self.hidden_host)
    }

    /// Greedy top-1 of the last logits row, computed on the device (4 bytes back instead of the row).
    pub fn forward_argmax(&mut self, kv: &mut KvState, tokens: &[u32]) -> ds4_model::Result<u32> {
        self.forward_dev(kv, tokens, None, Logits::Last).map_err(me)?;
        let v = self.cfg.n_vocab;
        let (lp, tp) = (self.wk.logits.ptr, self.wk.top1.ptr);
        self.g.launch("argmax_row", (1, 1, 1), 1024, 0, &[A::P(lp), A::I(v as i32), A::P(tp)]).map_err(me)?;
        let mut t = [0i32];
        self.g.dtoh(&mut t, tp).map_err(me)?;
        Ok(t[0] as u32)
    }

    /// Same contract as `Stage::forward`.
    pub fn forward(&mut self, kv: &mut KvState, tokens: &[u32], hidden_in: Option<&[f32]>, want: Logits) -> ds4_model::Result<&[f32]> {
        let rows = self.forward_dev(kv, tokens, hidden_in, want).map_err(me)?;
        let v = self.cfg.n_vocab;
        self.logits_host.resize(rows * v, 0.0);
        if rows > 0 {
            let p = self.wk.logits.ptr;
            self.g.dtoh(&mut self.logits_host, p).map_err(me)?;
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
        let pos0 = kv.pos;
        let hd = self.cfg.hc_dim();
        let tp = self.wk.tokens.ptr;
        self.g.htod(tp, tokens)?;
        let d = self.cfg.head_dim;
        self.decode_mode = n == 1 && d % 4 == 0 && d <= 1024;
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
                self.g.launch("embed", (n as u32, 1, 1), 256, 0, &args)?;
            }
            (None, None) => return Err("stage without embedding needs a hidden-state input".into()),
        }
        for li in 0..self.layers.len() {
            self.attention(li, n, pos0)?;
            self.ffn(li, n)?;
            if self.trace.is_some() {
                let mut h = vec![0f32; n * hd];
                self.g.dtoh(&mut h, self.wk.x.ptr)?;
                self.trace.as_mut().unwrap().push(h);
            }
        }
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

    fn dpos_arg(&self) -> u64 {
        if self.decode_mode {
            self.dpos.ptr
        } else {
            0
        }
    }

    /// One decode step through the captured graph (captured on first use for this input/output kind).
    fn decode_graph(&mut self, kv: &mut KvState, tokens: &[u32], hidden_in: Option<&[f32]>, want: Logits) -> Result<usize> {
        let hd = self.cfg.hc_dim();
        if let (None, Some(em)) = (hidden_in, &self.embed) {
            if tokens[0] as usize >= em.rows {
                return Err(format!("token id {} is outside the vocabulary ({})", tokens[0], em.rows));
            }
        }
        if let Some(h) = hidden_in {
            if h.len() != hd {
                return Err(format!("hidden input has {} floats, expected {hd}", h.len()));
            }
            let xp = self.wk.x.ptr;
            self.g.htod(xp, h)?;
        } else if self.embed.is_none() {
            return Err("stage without embedding needs a hidden-state input".into());
        }
        let head = want != Logits::None && self.head.is_some();
        let key = 2 * hidden_in.is_some() as usize + head as usize;
        if self.graphs[key].is_none() {
            self.graphs[key] = Some(self.capture_decode(hidden_in.is_none(), head)?);
        }
        let exec = self.graphs[key].as_ref().unwrap().exec;
        // SAFETY: exec is a live instantiated graph whose nodes use this stage's device buffers.
        unsafe { cudarc::driver::result::graph::launch(exec, self.g.stream) }.map_err(|e| format!("cuGraphLaunch: {e:?}"))?;
        kv.pos += 1;
        self.dev_pos = kv.pos;
        Ok(head as usize)
    }

    /// Records the launches of one decode step (embedding, layers, head) into a CUDA graph.
    fn capture_decode(&mut self, embed: bool, head: bool) -> Result<DecodeGraph> {
        use cudarc::driver::{result as drv, sys as dsys};
        // SAFETY: our stream; thread-local capture mode (other threads' CUDA calls are unaffected).
        unsafe { drv::stream::begin_capture(self.g.stream, dsys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL) }
            .map_err(|e| format!("cuStreamBeginCapture: {e:?}"))?;
        let body = (|| -> Result<()> {
            if embed {
                let em = self.embed.unwrap();
                let args = [A::P(em.ptr), A::I(ty_code(em.ty)), A::P(self.wk.tokens.ptr), A::P(self.wk.x.ptr), A::I(self.cfg.n_embd as i32), A::I(self.cfg.n_hc as i32)];
                self.g.launch("embed", (1, 1, 1), 256, 0, &args)?;
            }
            for li in 0..self.layers.len() {
                self.attention(li, 1, 0)?;
                self.ffn(li, 1)?;
            }
            if head {
                self.head_fwd(0, 1)?;
            }
            Ok(())
        })();
        // SAFETY: ends the capture begun above (also after an error, which invalidates the graph).
        let graph = unsafe { drv::stream::end_capture(self.g.stream) }.map_err(|e| format!("cuStreamEndCapture: {e:?}"));
        body?;
        let graph = graph?;
        // SAFETY: graph is the complete capture above.
        let exec = unsafe { drv::graph::instantiate(graph, dsys::CUgraphInstantiate_flags(0)) }.map_err(|e| {
            // SAFETY: destroying the graph we own after a failed instantiation.
            unsafe {
                let _ = drv::graph::destroy(graph);
            }
            format!("cuGraphInstantiate: {e:?}")
        })?;
        Ok(DecodeGraph { graph, exec })
    }

    // ---- building blocks ----------------------------------------------------------------------

    /// Mat-vec kernel over `n` tokens for `z` slots (see MV_ARGS in kernels.cu).
    #[allow(clippy::too_many_arguments)]
    fn mv(&mut self, w: u64, m: &DM, w_mat_bytes: usize, eids: u64, x: u64, ldx: usize, x_z: usize, y: u64, ldy: usize, y_z: usize, rows: usize, n: usize, z: usize) -> Result<()> {
        launch_mv(&mut self.g, m, w, w_mat_bytes, eids, x, ldx, x_z, y, ldy, y_z, rows, n, z)
    }

    /// f16 copy of matrix `idx` of a stack (the weights themselves when already F16).
    fn dequant(&mut self, m: &DM, idx: usize) -> Result<u64> {
        let src = m.ptr + (idx * m.mat_bytes()) as u64;
        if m.ty == GgmlType::F16 {
            return Ok(src);
        }
        let elems = m.rows * m.cols;
        if elems > self.wk.wh_elems {
            return Err("dequantization scratch too small".into());
        }
        let dst = self.wk.wh.ptr;
        launch_dq(&mut self.g, m, src, dst, elems)?;
        Ok(dst)
    }

    fn to_f16(&mut self, x: u64, ld: usize, rows: usize, cols: usize) -> Result<u64> {
        let dst = self.wk.xh.ptr;
        self.g.launch("f32_to_f16", (cdiv(rows * cols, 256), 1, 1), 256, 0, &[A::P(x), A::I(ld as i32), A::P(dst), A::I(rows as i32), A::I(cols as i32)])?;
        Ok(dst)
    }

    fn gemm_ok(&self, m: &DM) -> bool { m.ty == GgmlType::F16 || m.rows * m.cols <= self.wk.wh_elems }

    /// y (n × rows, ldy) = x (n × cols, ldx) · Wᵀ for matrix `idx` of `m`.
    fn mm_idx(&mut self, m: &DM, idx: usize, x: u64, ldx: usize, n: usize, y: u64, ldy: usize) -> Result<()> {
        if n < self.gemm_min || !self.gemm_ok(m) {
            let w = m.ptr + (idx * m.mat_bytes()) as u64;
            return self.mv(w, m, 0, 0, x, ldx, 0, y, ldy, 0, m.rows, n, 1);
        }
        let wh = self.dequant(m, idx)?;
        let xh = self.to_f16(x, ldx, n, m.cols)?;
        self.g.gemm_f16(m.rows, n, m.cols, wh, m.cols, xh, m.cols, y, ldy)
    }

    fn mm(&mut self, m: &DM, x: u64, n: usize, y: u64) -> Result<()> { self.mm_idx(m, 0, x, m.cols, n, y, m.rows) }

    fn rms(&mut self, x: u64, ldx: usize, y: u64, ldy: usize, d: usize, w: u64, n: usize) -> Result<()> {
        let eps = self.cfg.rms_eps;
        // Few rows (decode): a whole SM per row; many rows: 256 threads each.
        let threads = if n < 64 { 1024 } else { 256 };
        self.g.launch("rms_rows", (n as u32, 1, 1), threads, 0, &[A::P(x), A::I(ldx as i32), A::P(y), A::I(ldy as i32), A::I(d as i32), A::P(w), A::F(eps)])
    }

    #[allow(clippy::too_many_arguments)]
    fn nrq(&mut self, x: u64, ldx: usize, y: u64, ldy: usize, rows: usize, d: usize, norm: bool, w: u64, freqs: u64, pos_base: i64, div: usize, mul: usize, qat: i32) -> Result<()> {
        self.nrq_at(x, ldx, y, ldy, rows, d, norm, w, freqs, pos_base, div, mul, qat, 0)
    }

    /// `nrq` with the decode options: in decode mode the position is read on the device (`dpos`), and a
    /// nonzero `comp_ratio` makes the single row the compressor window closing at that position.
    #[allow(clippy::too_many_arguments)]
    fn nrq_at(&mut self, x: u64, ldx: usize, y: u64, ldy: usize, rows: usize, d: usize, norm: bool, w: u64, freqs: u64, pos_base: i64, div: usize, mul: usize, qat: i32, comp_ratio: usize) -> Result<()> {
        if rows == 0 {
            return Ok(());
        }
        let half = (self.cfg.rope_dim / 2) as i32;
        let smem = (d * 8 + 32 * 8 + d * 4) as u32;
        let args = [
            A::P(x),
            A::I(ldx as i32),
            A::P(y),
            A::I(ldy as i32),
            A::I(d as i32),
            A::I(norm as i32),
            A::P(w),
            A::F(self.cfg.rms_eps),
            A::P(freqs),
            A::I(half),
            A::L(pos_base),
            A::I(div as i32),
            A::I(mul as i32),
            A::I(qat),
            A::P(self.dpos_arg()),
            A::I(comp_ratio as i32),
        ];
        self.g.launch("norm_rope_qat", (rows as u32, 1, 1), d as u32, smem, &args)
    }

    /// Sub-layer entry: mix projection of the raw streams, then one fused kernel for the flat RMS
    /// factor, Sinkhorn, the collapse and the sub-layer norm (weight `norm`) into `xn`.
    fn hc_pre(&mut self, hc_fn: DM, scale: u64, base: u64, norm: u64, n: usize) -> Result<()> {
        let c = &self.cfg;
        let (e, nh) = (c.n_embd, c.n_hc);
        if nh > 16 || nh * nh > 32 {
            return Err(format!("{nh} hyper-connection streams (the fused kernel handles up to 5)"));
        }
        let (x, mix, mixes, xn) = (self.wk.x.ptr, self.wk.mix.ptr, self.wk.mixes.ptr, self.wk.xn.ptr);
        self.mm(&hc_fn, x, n, mix)?;
        let args = [
            A::P(mix),
            A::P(scale),
            A::P(base),
            A::I(nh as i32),
            A::I(self.cfg.sinkhorn_iters as i32),
            A::F(self.cfg.hc_eps),
            A::P(x),
            A::I(e as i32),
            A::P(mixes),
            A::P(norm),
            A::F(self.cfg.rms_eps),
            A::P(xn),
            A::I(!self.decode_mode as i32),
        ];
        if self.decode_mode {
            // The Sinkhorn matrix is only read by hc_post: off the critical path, on side stream 1
            // (joined before hc_post by the sub-layer's branch joins).
            let (it, he, re) = (self.cfg.sinkhorn_iters as i32, self.cfg.hc_eps, self.cfg.rms_eps);
            self.g.fork(1)?;
            let cargs = [A::P(mix), A::P(scale), A::P(base), A::I(nh as i32), A::I(it), A::F(he), A::P(x), A::I(e as i32), A::P(mixes), A::F(re)];
            self.g.launch("hc_comb", (n as u32, 1, 1), 1024, 0, &cargs)?;
            self.g.to_main();
        }
        self.g.launch("hc_pre_norm", (n as u32, 1, 1), 1024, (e * 4) as u32, &args)
    }

    fn hc_post(&mut self, n: usize) -> Result<()> {
        let e = self.cfg.n_embd;
        let args = [A::P(self.wk.mixes.ptr), A::I(self.cfg.n_hc as i32), A::P(self.wk.y.ptr), A::P(self.wk.x.ptr), A::I(e as i32)];
        self.g.launch("hc_post", (cdiv(e, 256), n as u32, 1), 256, 0, &args)
    }

    fn attention(&mut self, li: usize, n: usize, pos0: usize) -> Result<()> {
        let cfg = self.cfg.clone();
        let (d, nh) = (cfg.head_dim, cfg.n_head);
        let qat = self.opts.qat;
        let dec = self.decode_mode;
        let il = self.range.first + li;
        let (hc_fn, hsc, hba) = {
            let l = &self.layers[li];
            (l.hc_attn.fn_, l.hc_attn.scale, l.hc_attn.base)
        };
        let an = self.layers[li].attn_norm;
        self.hc_pre(hc_fn, hsc, hba, an, n)?;
        let l = &self.layers[li];
        let (_, q_a, q_a_norm, q_b, kvm, kv_norm, freqs, sinks, ratio) =
            (l.attn_norm, l.q_a, l.q_a_norm, l.q_b, l.kv, l.kv_norm, l.freqs, l.sinks, l.ratio);
        let comp = l.comp.as_ref().map(|c| (c.ape, c.kv, c.gate, c.norm));
        let idx = l.indexer.as_ref().map(|i| (i.q_b, i.proj, i.comp.ape, i.comp.kv, i.comp.gate, i.comp.norm));
        let wk = &self.wk;
        let (_, xn, qr, q, kvb, ck, cg, pooled, o) = (wk.cur.ptr, wk.xn.ptr, wk.qr.ptr, wk.q.ptr, wk.kvb.ptr, wk.ck.ptr, wk.cg.ptr, wk.pooled.ptr, wk.o.ptr);
        // Decode runs three independent chains concurrently (side streams 1 and 2, joined before the
        // indexer): the shared KV row, the compressors, and the Q path; each is latency-bound alone.
        if dec {
            self.g.fork(1)?;
        }
        self.mm(&kvm, xn, n, kvb)?;
        self.nrq(kvb, d, kvb, d, n, d, true, kv_norm, freqs, pos0 as i64, 1, 1, if qat { 1 } else { 0 })?;
        if dec {
            self.g.to_main();
            self.g.fork(2)?;
        }
        // Compressors.
        let (ring, comp_rows, st_kv, st_sc, idx_rows, ist_kv, ist_sc) = {
            let k = &self.kv[li];
            let p = |b: &Option<DBuf>| b.as_ref().map_or(0, |b| b.ptr);
            (k.ring.ptr, p(&k.comp), p(&k.st_kv), p(&k.st_sc), p(&k.idx), p(&k.ist_kv), p(&k.ist_sc))
        };
        let nc_last = if ratio != 0 { (pos0 + n) / ratio } else { 0 };
        if let Some((ape, ckm, cgm, cnorm)) = comp {
            let coff = cfg.compress_coff(il);
            let wd = coff * d;
            let row0 = pos0 / ratio;
            // Decode: one launch that writes the window closing at the device position, if any.
            let (nwin, cr, out0) = if dec { (1, ratio, 0) } else { ((pos0 + n) / ratio - row0, 0, row0) };
            let dp = self.dpos_arg();
            self.mm(&ckm, xn, n, ck)?;
            self.mm(&cgm, xn, n, cg)?;
            let args = [A::P(ck), A::P(cg), A::P(ape), A::P(st_kv), A::P(st_sc), A::P(pooled), A::I(n as i32), A::L(pos0 as i64), A::I(ratio as i32), A::I(wd as i32), A::I(d as i32), A::P(dp)];
            self.g.launch("comp_seq", (1, 1, 1), (wd as u32).div_ceil(32) * 32, 0, &args)?;
            self.nrq_at(pooled, d, comp_rows + (out0 * d * 4) as u64, d, nwin, d, true, cnorm, freqs, (row0 * ratio) as i64, 1, ratio, if qat { 1 } else { 0 }, cr)?;
            if let Some((_, _, iape, ikm, igm, inorm)) = idx {
                let id = cfg.idx_dim;
                let iwd = coff * id;
                self.mm(&ikm, xn, n, ck)?;
                self.mm(&igm, xn, n, cg)?;
                let args = [A::P(ck), A::P(cg), A::P(iape), A::P(ist_kv), A::P(ist_sc), A::P(pooled), A::I(n as i32), A::L(pos0 as i64), A::I(ratio as i32), A::I(iwd as i32), A::I(id as i32), A::P(dp)];
                self.g.launch("comp_seq", (1, 1, 1), (iwd as u32).div_ceil(32) * 32, 0, &args)?;
                self.nrq_at(pooled, id, idx_rows + (out0 * id * 4) as u64, id, nwin, id, true, inorm, freqs, (row0 * ratio) as i64, 1, ratio, if qat { 2 } else { 0 }, cr)?;
            }
        }
        if dec {
            self.g.to_main();
        }
        // Q path; the indexer's query (from the same normalised qr) and weights run beside q_b in decode.
        self.mm(&q_a, xn, n, qr)?;
        self.rms(qr, cfg.q_lora, qr, cfg.q_lora, cfg.q_lora, q_a_norm, n)?;
        let topk = cfg.idx_topk;
        let idx_active = idx.is_some() && (nc_last > topk || dec);
        if let (true, Some((iqb, iproj, ..))) = (idx_active, idx) {
            let (ih, id) = (cfg.idx_heads, cfg.idx_dim);
            let (iq, iw) = (self.wk.iq.ptr, self.wk.iw.ptr);
            if dec {
                self.g.fork(1)?;
            }
            self.mm(&iqb, qr, n, iq)?;
            self.mm(&iproj, xn, n, iw)?;
            self.nrq(iq, id, iq, id, n * ih, id, false, 0, freqs, pos0 as i64, ih, 1, if qat { 2 } else { 0 })?;
            let ws = 1.0 / ((id * ih) as f32).sqrt();
            self.g.launch("scale_inplace", (cdiv(n * ih, 256), 1, 1), 256, 0, &[A::P(iw), A::P((n * ih) as u64), A::F(ws)])?;
            if dec {
                self.g.to_main();
            }
        }
        self.mm(&q_b, qr, n, q)?;
        self.nrq(q, d, q, d, n * nh, d, true, 0, freqs, pos0 as i64, nh, 1, 0)?;
        if dec {
            self.g.join(1)?;
            self.g.join(2)?;
        }
        // Indexer selection for tokens that see more compressed rows than top_k.
        let mut sel = 0u64;
        if idx.is_some() {
            if idx_active {
                let (ih, id) = (cfg.idx_heads, cfg.idx_dim);
                let (iq, iw, scores, selp, ldsc) = (self.wk.iq.ptr, self.wk.iw.ptr, self.wk.scores.ptr, self.wk.sel.ptr, self.wk.ldsc);
                let smem = ((ih * (id + 1) + 16 * id + 16 * 8) * 4) as u32;
                if ih > 256 {
                    return Err("indexer with more than 256 heads".into());
                }
                let dp = self.dpos_arg();
                // Decode: the grid covers the largest row count this context can reach (blocks past the
                // position's rows return at once), so the launch does not depend on the position.
                let rows_grid = if dec { compressed_capacity(self.ctx, ratio) } else { nc_last };
                let args = [A::P(iq), A::P(iw), A::P(idx_rows), A::P(scores), A::I(ldsc as i32), A::L(pos0 as i64), A::I(ratio as i32), A::I(topk as i32), A::I(ih as i32), A::I(id as i32), A::P(dp)];
                self.g.launch("idx_scores", (cdiv(rows_grid, 16), n as u32, 1), 256, smem, &args)?;
                let args = [A::P(scores), A::I(ldsc as i32), A::P(selp), A::L(pos0 as i64), A::I(ratio as i32), A::I(topk as i32), A::P(dp)];
                self.g.launch("idx_topk", (n as u32, 1, 1), 1024, 0, &args)?;
                sel = selp;
            }
        }
        // Attention.
        let ncomp_max = if sel != 0 { nc_last.min(topk) } else { nc_last };
        let ncand = cfg.swa.min(pos0 + n) + ncomp_max;
        let mut hg = 1usize;
        if n > 1 {
            for c in [16usize, 4] {
                if nh % c == 0 && (c * (d + ncand) * 4) <= 200 * 1024 {
                    hg = c;
                    break;
                }
            }
        }
        if dec {
            return self.attention_decode(li, pos0, sel);
        }
        let smem = ((hg * (d + ncand) + if hg == 1 { 8 * d + 4 } else { 0 }) * 4) as u32;
        if smem > 220 * 1024 {
            return Err(format!("attention over {ncand} candidates needs {smem} bytes of shared memory"));
        }
        let name = match hg {
            16 => "attn_h16",
            4 => "attn_h4",
            _ => "attn_h1",
        };
        let args = [
            A::P(q),
            A::P(kvb),
            A::P(ring),
            A::P(comp_rows),
            A::P(sel),
            A::P(sinks),
            A::P(o),
            A::I(nh as i32),
            A::I(d as i32),
            A::L(pos0 as i64),
            A::I(cfg.swa as i32),
            A::I(ratio as i32),
            A::I(topk as i32),
            A::P(freqs),
            A::I((cfg.rope_dim / 2) as i32),
        ];
        self.g.launch(name, (n as u32, (nh / hg) as u32, 1), 256, smem, &args)?;
        self.attention_out(li, n, pos0, true)
    }

    /// Decode attention for one token: candidates split over blocks, then merged (attn_dec*).
    fn attention_decode(&mut self, li: usize, pos0: usize, sel: u64) -> Result<()> {
        let cfg = &self.cfg;
        let (d, nh, swa, ratio, topk, half) = (cfg.head_dim, cfg.n_head, cfg.swa, self.layers[li].ratio, cfg.idx_topk, cfg.rope_dim / 2);
        // The most candidates this layer can have within the context (the grid does not depend on the
        // position; splits past the current candidates return at once).
        let cap = if ratio != 0 { compressed_capacity(self.ctx, ratio) } else { 0 };
        let max_cand = swa.min(self.ctx) + if sel != 0 { cap.min(topk) } else { cap };
        let nsplit = max_cand.div_ceil(32).max(1);
        if nsplit > self.wk.adec_splits {
            return Err(format!("decode attention over {max_cand} candidates exceeds the planned {} splits", self.wk.adec_splits));
        }
        let dp = self.dpos_arg();
        let (l, k) = (&self.layers[li], &self.kv[li]);
        let (freqs, sinks) = (l.freqs, l.sinks);
        let (ring, comp_rows) = (k.ring.ptr, k.comp.as_ref().map_or(0, |b| b.ptr));
        let (q, kvb, o, part) = (self.wk.q.ptr, self.wk.kvb.ptr, self.wk.o.ptr, self.wk.adec.ptr);
        let smem = ((8 * d + 32 * d + 8 * 32) * 4) as u32;
        let args = [
            A::P(q),
            A::P(kvb),
            A::P(ring),
            A::P(comp_rows),
            A::P(sel),
            A::P(part),
            A::I(nh as i32),
            A::I(d as i32),
            A::L(pos0 as i64),
            A::I(swa as i32),
            A::I(ratio as i32),
            A::I(topk as i32),
            A::I(nsplit as i32),
            A::P(dp),
        ];
        self.g.launch("attn_dec", (nh.div_ceil(8) as u32, nsplit as u32, 1), 256, smem, &args)?;
        let args = [
            A::P(part),
            A::P(sinks),
            A::P(o),
            A::I(nh as i32),
            A::I(d as i32),
            A::L(pos0 as i64),
            A::I(nsplit as i32),
            A::I(swa as i32),
            A::I(ratio as i32),
            A::I(topk as i32),
            A::P(sel),
            A::P(freqs),
            A::I(half as i32),
            A::P(dp),
            A::P(kvb),
            A::P(ring),
        ];
        self.g.launch("attn_dec_merge", (nh as u32, 1, 1), (d / 4).div_ceil(32) as u32 * 32, 0, &args)?;
        self.attention_out(li, 1, pos0, false)
    }

    /// Ring update, grouped low-rank output projection, second projection, HC post.
    fn attention_out(&mut self, li: usize, n: usize, pos0: usize, ring_store: bool) -> Result<()> {
        let cfg = self.cfg.clone();
        let (d, qd) = (cfg.head_dim, cfg.q_dim());
        let (out_a, out_b) = (self.layers[li].out_a, self.layers[li].out_b);
        let ring = self.kv[li].ring.ptr;
        let (kvb, o, low, y) = (self.wk.kvb.ptr, self.wk.o.ptr, self.wk.low.ptr, self.wk.y.ptr);
        let dp = self.dpos_arg();
        if ring_store {
            self.g.launch("ring_store", (n as u32, 1, 1), 128, 0, &[A::P(kvb), A::P(ring), A::I(n as i32), A::I(d as i32), A::L(pos0 as i64), A::I(cfg.swa as i32), A::P(dp)])?;
        }
        // Grouped low-rank output projection, then the second projection.
        let (g, hpg, ol) = (cfg.o_groups, cfg.heads_per_group(), cfg.o_lora);
        let gin = hpg * d;
        if n < self.gemm_min || !self.gemm_ok(&out_a) {
            self.mv(out_a.ptr, &out_a, ol * out_a.row_bytes, 0, o, qd, gin, low, g * ol, ol, ol, n, g)?;
        } else {
            let wh = self.dequant(&out_a, 0)?;
            let oh = self.to_f16(o, qd, n, qd)?;
            for gi in 0..g {
                self.g.gemm_f16(ol, n, gin, wh + (gi * ol * gin * 2) as u64, gin, oh + (gi * gin * 2) as u64, qd, low + (gi * ol * 4) as u64, g * ol)?;
            }
        }
        self.mm(&out_b, low, n, y)?;
        self.hc_post(n)
    }

    fn ffn(&mut self, li: usize, n: usize) -> Result<()> {
        let cfg = self.cfg.clone();
        let (e, ne, k, ff) = (cfg.n_embd, cfg.n_expert, cfg.n_expert_used, cfg.ff_exp);
        let (hc_fn, hsc, hba) = {
            let l = &self.layers[li];
            (l.hc_ffn.fn_, l.hc_ffn.scale, l.hc_ffn.base)
        };
        let fnw = self.layers[li].ffn_norm;
        self.hc_pre(hc_fn, hsc, hba, fnw, n)?;
        let l = &self.layers[li];
        let (_, gate_inp, bias, hash, gate, up, down, shared, clamp) =
            (l.ffn_norm, l.gate_inp, l.exp_bias.unwrap_or(0), l.tid2eid.unwrap_or(0), l.gate_exps, l.up_exps, l.down_exps, l.shared, l.clamp);
        let wk = &self.wk;
        let (_, xn, rlog, eids, ew, ex_a, ex_b, ex_out, y) = (wk.cur.ptr, wk.xn.ptr, wk.rlog.ptr, wk.eids.ptr, wk.ew.ptr, wk.ex_a.ptr, wk.ex_b.ptr, wk.ex_out.ptr, wk.y.ptr);
        let (sh_a, sh_b, sh_out, tokens) = (wk.sh_a.ptr, wk.sh_b.ptr, wk.sh_out.ptr, wk.tokens.ptr);
        // Decode: the shared expert runs on side stream 1 while the router and routed experts run here.
        let dec = self.decode_mode;
        let mut add = 0u64;
        if let Some([sg, su, sd]) = shared {
            if dec {
                self.g.fork(1)?;
            }
            self.mm(&sg, xn, n, sh_a)?;
            self.mm(&su, xn, n, sh_b)?;
            self.g.launch("swiglu", (cdiv(n * ff, 256), 1, 1), 256, 0, &[A::P(sh_a), A::P(sh_b), A::P((n * ff) as u64), A::I(ff as i32), A::F(clamp), A::P(0)])?;
            self.mm(&sd, sh_a, n, sh_out)?;
            add = sh_out;
            if dec {
                self.g.to_main();
            }
        }
        self.mm(&gate_inp, xn, n, rlog)?;
        let bs = (ne.next_power_of_two()).clamp(32, 1024) as u32;
        if ne > 1024 || k > 16 {
            return Err("router supports up to 1024 experts and 16 per token".into());
        }
        let args = [
            A::P(rlog),
            A::I(ne as i32),
            A::P(bias),
            A::P(hash),
            A::P(tokens),
            A::I(k as i32),
            A::I(cfg.expert_weights_norm as i32),
            A::F(cfg.expert_weights_scale),
            A::P(eids),
            A::P(ew),
        ];
        self.g.launch("route", (n as u32, 1, 1), bs, 0, &args)?;
        let mut slot_pos = 0u64;
        if n == 1 {
            // Decode: the chosen experts' matrices are read straight from the stacks (ids stay on the device).
            if dec {
                self.g.fork(2)?;
            }
            self.mv(up.ptr, &up, up.mat_bytes(), eids, xn, e, 0, ex_b, ff, ff, ff, 1, k)?;
            if dec {
                self.g.to_main();
            }
            self.mv(gate.ptr, &gate, gate.mat_bytes(), eids, xn, e, 0, ex_a, ff, ff, ff, 1, k)?;
            if dec {
                self.g.join(2)?;
            }
            self.g.launch("swiglu", (cdiv(k * ff, 256), 1, 1), 256, 0, &[A::P(ex_a), A::P(ex_b), A::P((k * ff) as u64), A::I(ff as i32), A::F(clamp), A::P(ew)])?;
            self.mv(down.ptr, &down, down.mat_bytes(), eids, ex_a, ff, ff, ex_out, e, e, e, 1, k)?;
        } else {
            self.experts_grouped(n, gate, up, down, clamp)?;
            slot_pos = self.wk.slot_pos.ptr;
        }
        if dec {
            // Shared expert and the Sinkhorn matrix (side stream 1).
            self.g.join(1)?;
        }
        let args = [A::P(ex_out), A::P(slot_pos), A::I(k as i32), A::P(add), A::P(y), A::I(e as i32), A::I(n as i32)];
        self.g.launch("moe_combine", (cdiv(e, 256), n as u32, 1), 256, 0, &args)?;
        self.hc_post(n)
    }

    /// Prefill experts: tokens grouped by expert (counts read back once per layer), one GEMM (or
    /// mat-vec for small groups) per expert matrix over its tokens.
    fn experts_grouped(&mut self, n: usize, gate: DM, up: DM, down: DM, clamp: f32) -> Result<()> {
        let (e, ne, k, ff) = (self.cfg.n_embd, self.cfg.n_expert, self.cfg.n_expert_used, self.cfg.ff_exp);
        let total = n * k;
        let wk = &self.wk;
        let (eids, ew, counts, cursor, slot_pos, gw, gtok, gx, xn, ex_a, ex_b, ex_out) =
            (wk.eids.ptr, wk.ew.ptr, wk.counts.ptr, wk.cursor.ptr, wk.slot_pos.ptr, wk.gw.ptr, wk.gtok.ptr, wk.gx.ptr, wk.xn.ptr, wk.ex_a.ptr, wk.ex_b.ptr, wk.ex_out.ptr);
        // SAFETY: counts holds ne ints on the device.
        unsafe { cudarc::driver::result::memset_d8_async(counts, 0, ne * 4, self.g.stream) }.map_err(|x| format!("{x:?}"))?;
        self.g.launch("moe_count", (cdiv(total, 256), 1, 1), 256, 0, &[A::P(eids), A::I(total as i32), A::P(counts)])?;
        let mut ch = std::mem::take(&mut self.counts_host);
        self.g.dtoh(&mut ch, counts)?;
        let mut offs = vec![0i32; ne];
        let mut acc = 0i32;
        for x in 0..ne {
            offs[x] = acc;
            acc += ch[x];
        }
        self.g.htod(cursor, &offs)?;
        self.g.launch("moe_scatter", (cdiv(total, 256), 1, 1), 256, 0, &[A::P(eids), A::P(ew), A::I(total as i32), A::I(k as i32), A::P(cursor), A::P(slot_pos), A::P(gw), A::P(gtok)])?;
        self.g.launch("gather_rows", (total as u32, 1, 1), 256, 0, &[A::P(xn), A::P(gtok), A::P(gx), A::I(e as i32)])?;
        let any_gemm = ch.iter().any(|&c| c as usize >= self.gemm_min);
        let gxh = if any_gemm { self.to_f16(gx, e, total, e)? } else { 0 };
        for x in 0..ne {
            let m = ch[x] as usize;
            if m == 0 {
                continue;
            }
            let off = offs[x] as usize;
            for (mat, out) in [(gate, ex_a), (up, ex_b)] {
                let yo = out + (off * ff * 4) as u64;
                if m >= self.gemm_min && self.gemm_ok(&mat) {
                    let wh = self.dequant(&mat, x)?;
                    self.g.gemm_f16(ff, m, e, wh, e, gxh + (off * e * 2) as u64, e, yo, ff)?;
                } else {
                    let w = mat.ptr + (x * mat.mat_bytes()) as u64;
                    self.mv(w, &mat, 0, 0, gx + (off * e * 4) as u64, e, 0, yo, ff, 0, ff, m, 1)?;
                }
            }
        }
        self.g.launch("swiglu", (cdiv(total * ff, 256), 1, 1), 256, 0, &[A::P(ex_a), A::P(ex_b), A::P((total * ff) as u64), A::I(ff as i32), A::F(clamp), A::P(gw)])?;
        let ah = if any_gemm { self.to_f16(ex_a, ff, total, ff)? } else { 0 };
        for x in 0..ne {
            let m = ch[x] as usize;
            if m == 0 {
                continue;
            }
            let off = offs[x] as usize;
            let yo = ex_out + (off * e * 4) as u64;
            if m >= self.gemm_min && self.gemm_ok(&down) {
                let wh = self.dequant(&down, x)?;
                self.g.gemm_f16(e, m, ff, wh, ff, ah + (off * ff * 2) as u64, ff, yo, e)?;
            } else {
                let w = down.ptr + (x * down.mat_bytes()) as u64;
                self.mv(w, &down, 0, 0, ex_a + (off * ff * 4) as u64, ff, 0, yo, e, 0, e, m, 1)?;
            }
        }
        self.counts_host = ch;
        Ok(())
    }

    fn head_fwd(&mut self, r0: usize, m: usize) -> Result<()> {
        let cfg = self.cfg.clone();
        let (hd, e, nh) = (cfg.hc_dim(), cfg.n_embd, cfg.n_hc);
        let h = self.head.as_ref().unwrap();
        let (hc_fn, sc, base, norm, output) = (h.hc_fn, h.hc_scale, h.hc_base, h.norm, h.output);
        let x = self.wk.x.ptr + (r0 * hd * 4) as u64;
        let (flat, mix, cur, logits) = (self.wk.flat.ptr, self.wk.mix.ptr, self.wk.cur.ptr, self.wk.logits.ptr);
        self.rms(x, hd, flat, hd, hd, 0, m)?;
        self.mm(&hc_fn, flat, m, mix)?;
        let args = [A::P(mix), A::P(sc), A::P(base), A::F(cfg.hc_eps), A::P(x), A::I(nh as i32), A::I(e as i32), A::P(cur)];
        self.g.launch("head_collapse", (m as u32, 1, 1), 256, 0, &args)?;
        self.rms(cur, e, cur, e, e, norm, m)?;
        self.mm(&output, cur, m, logits)
    }
}

const GIB: f64 = (1u64 << 30) as f64;

/// Op-level check of the matrix kernels: returns `y = x·Wᵀ` (n × rows) through the mat-vec kernel and
/// through dequantize + cuBLAS (the prefill path), for comparison with the CPU. With `split`, Q8_0 and
/// IQ2_XXS rows are first converted to the split layout (as at load), exercising the mv4 kernels.
pub fn matmul_paths(ty: GgmlType, rows: usize, cols: usize, data: &[u8], x: &[f32], n: usize, split: bool) -> ds4_model::Result<(Vec<f32>, Vec<f32>)> {
    (|| -> Result<(Vec<f32>, Vec<f32>)> {
        let mut g = Gpu::new(&ds4_quant::iq2xxs_tables::IQ2XXS_GRID_CONST)?;
        let row_bytes = ty.row_bytes(cols).ok_or("bad cols")?;
        let wb = g.alloc(data.len())?;
        g.htod(wb.ptr, data)?;
        let mut m = DM { ptr: wb.ptr, ty, rows, cols, n_mat: 1, row_bytes, split: false };
        if split {
            split_layout(&mut g, &mut m)?;
        }
        let xb = g.alloc(x.len() * 4)?;
        g.htod(xb.ptr, x)?;
        let y1 = g.alloc(n * rows * 4)?;
        let y2 = g.alloc(n * rows * 4)?;
        let wh = g.alloc(rows * cols * 2)?;
        let xh = g.alloc(n * cols * 2)?;
        launch_mv(&mut g, &m, wb.ptr, 0, 0, xb.ptr, cols, 0, y1.ptr, rows, 0, rows, n, 1)?;
        let whp = if ty == GgmlType::F16 {
            wb.ptr
        } else {
            launch_dq(&mut g, &m, wb.ptr, wh.ptr, rows * cols)?;
            wh.ptr
        };
        g.launch("f32_to_f16", (cdiv(n * cols, 256), 1, 1), 256, 0, &[A::P(xb.ptr), A::I(cols as i32), A::P(xh.ptr), A::I(n as i32), A::I(cols as i32)])?;
        g.gemm_f16(rows, n, cols, whp, cols, xh.ptr, cols, y2.ptr, rows)?;
        let mut a = vec![0f32; n * rows];
        let mut b = vec![0f32; n * rows];
        g.dtoh(&mut a, y1.ptr)?;
        g.dtoh(&mut b, y2.ptr)?;
        Ok((a, b))
    })()
    .map_err(me)
}

/// Seconds per mat-vec call (one token) of the kernel the stage would use for a `ty` matrix stack of
/// `z` slots of `rows` × `cols` (weights are arbitrary bytes: only the timing is of interest), timed
/// with CUDA events over `reps` back-to-back launches.
pub fn bench_matvec(ty: GgmlType, rows: usize, cols: usize, z: usize, reps: usize) -> ds4_model::Result<f64> {
    (|| -> Result<f64> {
        let mut g = Gpu::new(&ds4_quant::iq2xxs_tables::IQ2XXS_GRID_CONST)?;
        let row_bytes = ty.row_bytes(cols).ok_or("bad cols")?;
        let wb = g.alloc_zeroed(row_bytes * rows * z)?;
        let mut m = DM { ptr: wb.ptr, ty, rows, cols, n_mat: z, row_bytes, split: false };
        split_layout(&mut g, &mut m)?;
        let xb = g.alloc_zeroed(cols * 4)?;
        let yb = g.alloc_zeroed(rows * z * 4)?;
        let eids: Vec<i32> = (0..z as i32).collect();
        let eb = g.alloc(z * 4)?;
        g.htod(eb.ptr, &eids)?;
        let ep = if z > 1 { eb.ptr } else { 0 };
        let run = |g: &mut Gpu| launch_mv(g, &m, wb.ptr, m.mat_bytes(), ep, xb.ptr, cols, 0, yb.ptr, rows, rows, rows, 1, z);
        run(&mut g)?;
        g.time(reps, run)
    })()
    .map_err(me)
}

/// Seconds to stream-read `bytes` of device memory once (the achievable read bandwidth).
pub fn bench_read(bytes: usize, reps: usize) -> ds4_model::Result<f64> {
    (|| -> Result<f64> {
        let mut g = Gpu::new(&ds4_quant::iq2xxs_tables::IQ2XXS_GRID_CONST)?;
        let b = g.alloc_zeroed(bytes)?;
        let o = g.alloc_zeroed(4)?;
        let blocks = (g.sms as u32).max(1) * 8;
        let run = |g: &mut Gpu| g.launch("read_sum", (blocks, 1, 1), 512, 0, &[A::P(b.ptr), A::P((bytes / 16) as u64), A::P(o.ptr)]);
        run(&mut g)?;
        g.time(reps, run)
    })()
    .map_err(me)
}
