//! Construction of the CUDA backend (`CudaOps`): weight upload (one pass of large copies), the split row layout, KV
//! state and work buffers sized from the context and the prefill chunk.
use super::*;
use crate::dec_attn::DecAttn;
use crate::gpu::{DBuf, SIDE_STREAMS};
use crate::matvec::{grouped_direct, split_layout, splits};
use ds4_model::kv::{compressed_capacity, compressor_rows};
use ds4_model::rope::Rope;
use ds4_model::residency;
use ds4_model::weights::{CompressorWeights, HcWeights, Mat};

/// Weight placement plan: matrices are recorded first (their device pointers are tagged indices into
/// `pending`, resolved once KV and work buffers are allocated and the plan is known to fit); small host
/// vectors (norms, biases) are copied to the device at once.
struct Uploader<'g, 'a> {
    g: &'g Gpu,
    bufs: Vec<DBuf>,
    pending: Vec<&'a [u8]>,
    vec_bytes: u64,
}

/// Tag of a matrix pointer not placed yet (bit 63: no device or host virtual address has it).
const PENDING: u64 = 1 << 63;

impl<'a> Uploader<'_, 'a> {
    fn bytes(&mut self, data: &'a [u8]) -> Result<u64> {
        self.pending.push(data);
        Ok(PENDING | (self.pending.len() - 1) as u64)
    }
    /// Small host vectors (norms, biases) are copied immediately.
    fn vec_f32(&mut self, v: &[f32]) -> Result<u64> {
        let b = self.g.alloc(v.len() * 4)?;
        self.g.htod(b.ptr, v)?;
        WEIGHT_UPLOADS.fetch_add(1, Ordering::Relaxed);
        let p = b.ptr;
        self.vec_bytes += b.bytes as u64;
        self.bufs.push(b);
        Ok(p)
    }
    fn vec_u32(&mut self, v: &[u32]) -> Result<u64> {
        let b = self.g.alloc(v.len() * 4)?;
        self.g.htod(b.ptr, v)?;
        WEIGHT_UPLOADS.fetch_add(1, Ordering::Relaxed);
        let p = b.ptr;
        self.vec_bytes += b.bytes as u64;
        self.bufs.push(b);
        Ok(p)
    }
    fn vec_f64(&mut self, v: &[f64]) -> Result<u64> {
        let b = self.g.alloc(v.len() * 8)?;
        self.g.htod(b.ptr, v)?;
        let p = b.ptr;
        self.vec_bytes += b.bytes as u64;
        self.bufs.push(b);
        Ok(p)
    }
}

/// Floats of one layer's device KV buffers (`KvState::new`'s arrays, plus the snapshot of the mutable ones).
struct KvFloats {
    ring: usize,
    comp: usize,
    st: usize,
    idx: usize,
    ist: usize,
}

impl KvFloats {
    fn new(cfg: &Config, il: usize, ratio: usize, indexer: bool, ctx: usize) -> Self {
        let (d, id) = (cfg.head_dim, cfg.idx_dim);
        let coff = cfg.compress_coff(il);
        let cap = compressed_capacity(ctx, ratio);
        Self {
            ring: cfg.swa * d,
            comp: if ratio != 0 { cap * d } else { 0 },
            st: if ratio != 0 { compressor_rows(ratio) * coff * d } else { 0 },
            idx: if indexer { cap * id } else { 0 },
            ist: if indexer { compressor_rows(ratio) * coff * id } else { 0 },
        }
    }
    fn snap(&self) -> usize { self.ring + 2 * self.st + 2 * self.ist }
    fn bytes(&self) -> u64 { 4 * (self.ring + self.comp + 2 * self.st + self.idx + 2 * self.ist + self.snap()) as u64 }
}

/// The GPU part of the memory plan (bytes).
#[derive(Debug, Clone, Copy, Default)]
pub struct GpuPlan {
    /// Weight matrices in device memory (0 when read in place from host memory).
    pub weights: u64,
    /// Norms, biases, RoPE tables (always copied: small).
    pub vectors: u64,
    pub kv: u64,
    /// Work buffers and the prefill expert scratch (measured as allocated).
    pub work: u64,
    /// Free device memory before the stage allocated anything.
    pub free: u64,
}

impl GpuPlan {
    pub fn total(&self) -> u64 { self.weights + self.vectors + self.kv + self.work }
    pub fn describe(&self, place: WeightPlace) -> String {
        let w = match place {
            WeightPlace::Device => format!("weights {:.2} GiB", self.weights as f64 / GIB),
            WeightPlace::Host => "weights 0 GiB (read in place from host memory)".to_string(),
        };
        format!(
            "GPU plan: {w} + vectors {:.2} GiB + KV {:.2} GiB + work {:.2} GiB = {:.2} GiB; {:.2} GiB free before loading",
            self.vectors as f64 / GIB,
            self.kv as f64 / GIB,
            self.work as f64 / GIB,
            self.total() as f64 / GIB,
            self.free as f64 / GIB
        )
    }
}

/// Free device memory (bytes) of the current context's device.
fn free_mem() -> Result<u64> { cudarc::driver::result::mem_get_info().map(|m| m.0 as u64).map_err(|e| format!("{e:?}")) }

/// Resolves a tagged matrix pointer to its placed address.
fn place(m: &mut DM, ptrs: &[u64]) {
    if m.ptr & PENDING != 0 {
        m.ptr = ptrs[(m.ptr & !PENDING) as usize];
    }
}

impl CudaOps {
    /// Uploads the part `part` (a sub-range of the stage's layers; the embedding and head only when it
    /// starts / ends the stage's range) to CUDA device `device`.
    pub(super) fn build(stage: &Stage, ctx: usize, fit: ChunkFit, part: LayerRange, device: usize, wplace: WeightPlace, slots: usize) -> Result<Self> {
        let cfg = stage.cfg.clone();
        let slots = slots.max(1);
        // A batched step holds one activation row per session: the work buffers have at least fit.min rows.
        if slots > fit.min {
            return Err(format!("{slots} KV slots (--batched-session / --concurrency) need at least as many activation rows, but --prefill-chunk is {}", fit.min));
        }
        let w = &stage.w;
        if part.first < w.range.first || part.last > w.range.last || part.first > part.last {
            return Err(format!("layers {} are not within the stage's layers {}", part.label(), w.range.label()));
        }
        let part = LayerRange { embed: w.range.embed && part.first == w.range.first, head: w.range.head && part.last == w.range.last, ..part };
        let mut g = Gpu::on_device(&ds4_quant::iq2xxs_tables::IQ2XXS_GRID_CONST, device)?;
        let (free, total) = cudarc::driver::result::mem_get_info().map_err(|e| format!("{e:?}"))?;
        let wname = if wplace == WeightPlace::Host { "weights read in place from host memory" } else { "weights copied to the GPU" };
        eprintln!("cuda: device {device}: {} ({}, {} SMs), {:.2} GiB free of {:.2} GiB; layers {}; {wname}", g.name, g.arch, g.sms, free as f64 / GIB, total as f64 / GIB, part.label());
        let mut plan = GpuPlan { free: free as u64, ..GpuPlan::default() };
        let mut up = Uploader { g: &g, bufs: Vec::new(), pending: Vec::new(), vec_bytes: 0 };
        fn dm<'a>(up: &mut Uploader<'_, 'a>, w: &'a ds4_model::Weights, m: &Mat) -> Result<DM> {
            let r = w.mat(m);
            if matches!(m.ty, GgmlType::F16 | GgmlType::BF16) && m.cols % 8 != 0 {
                return Err(format!("F16 matrix with {} columns (need a multiple of 8)", m.cols));
            }
            let ptr = up.bytes(r.data)?;
            let row_bytes = m.ty.row_bytes(m.cols).ok_or("bad row")?;
            Ok(DM { ptr, ty: m.ty, rows: m.rows, cols: m.cols, n_mat: m.n_mat, row_bytes, split: false })
        }
        fn hc<'a>(up: &mut Uploader<'_, 'a>, w: &'a ds4_model::Weights, h: &HcWeights) -> Result<DHc> {
            Ok(DHc { fn_: dm(up, w, &h.fn_)?, scale: up.vec_f32(&h.scale)?, base: up.vec_f32(&h.base)? })
        }
        fn comp<'a>(up: &mut Uploader<'_, 'a>, w: &'a ds4_model::Weights, c: &CompressorWeights) -> Result<DComp> {
            Ok(DComp { ape: up.vec_f32(&c.ape)?, kv: dm(up, w, &c.kv)?, gate: dm(up, w, &c.gate)?, norm: up.vec_f32(&c.norm)? })
        }
        residency::set_phase(residency::Phase::Load);
        let embed = match w.embed.as_ref().filter(|_| part.embed) {
            Some(m) => {
                if ty_code(m.ty) < 0 {
                    return Err(format!("embedding type {} not supported on CUDA", m.ty.name()));
                }
                Some(dm(&mut up, w, m)?)
            }
            None => None,
        };
        let mut layers = Vec::new();
        for l in w.layers.iter().filter(|l| part.contains(l.il)) {
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
        let head = match w.head.as_ref().filter(|_| part.head) {
            Some(h) => Some(DHead {
                hc_fn: dm(&mut up, w, &h.hc_fn)?,
                hc_scale: up.vec_f32(&h.hc_scale)?,
                hc_base: up.vec_f32(&h.hc_base)?,
                norm: up.vec_f32(&h.norm)?,
                output: dm(&mut up, w, &h.output)?,
            }),
            None => None,
        };
        let pending = std::mem::take(&mut up.pending);
        plan.vectors = up.vec_bytes;
        let vec_bufs = std::mem::take(&mut up.bufs);
        drop(up);
        let mat_bytes: u64 = pending.iter().map(|d| d.len() as u64).sum();
        plan.weights = if wplace == WeightPlace::Device { mat_bytes } else { 0 };
        let mut layers = layers;
        let mut head = head;
        let mut embed = embed;

        // KV state (sized by the same formulas the plan counts), refused with the numbers before any
        // large allocation when it and the weights cannot fit.
        let kvf: Vec<KvFloats> = layers.iter().enumerate().map(|(li, l)| KvFloats::new(&cfg, part.first + li, l.ratio, l.indexer.is_some(), ctx)).collect();
        // One KV set per slot (session decoded in a batch). Slot 0 also holds the undo buffers of a
        // verify step (undo.rs) of up to `ucap` rows.
        let brows = slots.max(VERIFY_ROWS.min(fit.min));
        let ucap = brows.min(VERIFY_ROWS);
        let ratios: Vec<usize> = layers.iter().map(|l| l.ratio).collect();
        let undo_f = |f: &KvFloats, ratio: usize| undo::undo_floats(cfg.head_dim, &[(f.st, ratio), (f.ist, ratio)], ucap);
        plan.kv = slots as u64 * kvf.iter().map(KvFloats::bytes).sum::<u64>() + kvf.iter().zip(&ratios).map(|(f, &r)| 4 * undo_f(f, r) as u64).sum::<u64>();
        let refuse = |plan: &GpuPlan, what: &str| -> String {
            let hint = if wplace == WeightPlace::Device { ", read the weights from host memory with --cuda-weights host" } else { "" };
            let sessions = if slots > 1 { format!(", fewer batched sessions (--batched-session / --concurrency, now {slots})") } else { String::new() };
            format!(
                "{what}: {} — use a smaller --ctx (now {ctx}) or --prefill-chunk (now {}){sessions}, serve fewer layers with --layers, spread them over several GPUs with --cuda-devices{hint}",
                plan.describe(wplace),
                fit.min
            )
        };
        if (plan.weights + plan.vectors + plan.kv) as f64 > plan.free as f64 * 0.97 {
            return Err(refuse(&plan, "the stage does not fit in the GPU's free memory"));
        }
        let kv_set = |undo: bool| -> Result<Vec<DKv>> {
            let mut kv = Vec::new();
            for (f, &ratio) in kvf.iter().zip(&ratios) {
                let opt = |n: usize| -> Result<Option<DBuf>> { if n > 0 { Ok(Some(g.alloc_zeroed(n * 4)?)) } else { Ok(None) } };
                kv.push(DKv {
                    ring: g.alloc_zeroed(f.ring * 4)?,
                    comp: opt(f.comp)?,
                    st_kv: opt(f.st)?,
                    st_sc: opt(f.st)?,
                    st_len: f.st,
                    idx: opt(f.idx)?,
                    ist_kv: opt(f.ist)?,
                    ist_sc: opt(f.ist)?,
                    ist_len: f.ist,
                    snap: g.alloc_zeroed(f.snap() * 4)?,
                    undo: if undo { Some(g.alloc_zeroed(undo_f(f, ratio) * 4)?) } else { None },
                });
            }
            Ok(kv)
        };
        // Slot 0 is selected (in `kv`); the others wait in `parked` (slot 0's entry there is empty).
        // Slot 0 also holds the undo buffers.
        let kv = kv_set(true)?;
        let mut parked = vec![Vec::new()];
        for _ in 1..slots {
            parked.push(kv_set(false)?);
        }
        let free_kv = free_mem()?;

        // Work buffers for batches of up to n tokens (n: the largest of fit's candidates that fits).
        let (d, id) = (cfg.head_dim, cfg.idx_dim);
        let (e, hd, k, ff, ne) = (cfg.n_embd, cfg.hc_dim(), cfg.n_expert_used, cfg.ff_exp, cfg.n_expert);
        // Rows of a batched step: one per slot, or a verify step's (each within the activation rows):
        // `brows` above.
        let f = |c: usize| g.alloc(c * 4);
        let cap4 = compressed_capacity(ctx, 4);
        let ldsc = cap4.max(1);
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
        let adec_splits = DecAttn::splits(cfg.swa.min(ctx) + max_comp);
        // Expert scratch (f16 copies for per-expert GEMMs): room for every expert's gate and up matrices
        // at once when a quarter of the free memory allows it, else fewer; at least two. None where the
        // grouped kernel reads every expert matrix as stored once loaded (Flash's IQ2_XXS and Q2_K
        // experts on the device: 512 x 16.8 MB less on an H200).
        let exps = || layers.iter().flat_map(|l| [l.gate_exps, l.up_exps, l.down_exps]);
        let loaded = |m: DM| DM { split: m.split || wplace == WeightPlace::Device && splits(&m), ..m };
        let all_direct = exps().all(|m| grouped_direct(&loaded(m)).is_some());
        let ewh_slot = if all_direct { 0 } else { exps().map(|m| m.rows * m.cols).max().unwrap_or(0) };
        let ewh_slots = if fit.max > 1 && ewh_slot > 0 {
            // A quarter of what stays free once the weights are placed.
            let free = (free_mem()?.saturating_sub(plan.weights)) as usize;
            let cap = std::env::var("DS4_CUDA_EXPERT_SCRATCH_GB").ok().and_then(|v| v.parse::<f64>().ok()).map_or(free / 4, |gb| (gb * GIB) as usize);
            (cap / (ewh_slot * 2)).clamp(2, 2 * ne)
        } else {
            0
        };
        // Largest one-token mat-vec input: columns times the slots reading their own rows (the
        // output projection's groups, the routed experts).
        // (Exact rows quantize each of their rows: a batch's or verify step's rows times the widest input.)
        let xq80_cap = (max_cols * cfg.o_groups.max(k).max(1)).max(brows * max_cols.max(cfg.q_dim())).next_multiple_of(256);
        let act8 = |len: usize, block: usize| -> Result<ActQ8> { Ok(ActQ8 { q: g.alloc(len.max(1))?, d: g.alloc(len.div_ceil(block).max(1) * 4)? }) };
        let hcd_slices = hd.div_ceil(256);
        let jobs_cap = layers.len() * 5 * ucap;
        let alloc_work = |n: usize| -> Result<Work> {
        let logit_rows = if head.is_some() { n } else { 1 };
        let xh_elems = n * max_cols.max(k * e).max(k * ff).max(cfg.q_dim());
        Ok(Work {
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
            // A prefill chunk's closing windows, or one per stream for a batched or verify step's rows.
            // A closing window's row per stream, or a verify step's rows per stream; a prefill chunk's windows.
            pooled: f((n / 4 + 2).max((SIDE_STREAMS + 1) * brows) * d.max(id))?,
            // The indexer compressor's inputs beside the main one's: a decode or verify step's rows.
            ick: f(brows * 2 * id)?,
            icg: f(brows * 2 * id)?,
            ipool: f(2 * id)?,
            iq: f(n * cfg.idx_heads * id)?,
            iw: f(n * cfg.idx_heads)?,
            scores: f(n * ldsc)?,
            ldsc,
            sel: f(n * cfg.idx_topk)?,
            o: f(n * cfg.q_dim())?,
            low: f(n * cfg.o_groups * cfg.o_lora)?,
            y: f(n * e)?,
            // Gate logits of a batch (a row each).
            rlog: f(n.max(brows * hcd_slices) * ne)?,
            eids: f(n * k)?,
            ew: f(n * k)?,
            ex_a: f(n * k * ff)?,
            ex_b: f(n * k * ff)?,
            ex_out: f(n * k * e)?,
            gx: f(n * k * e)?,
            gw: f(n * k)?,
            gtok: f(n * k)?,
            rep_tok: f((brows * k).max(1))?,
            bpos: g.alloc(brows * 8)?,
            slot_pos: f(n * k)?,
            counts: f(ne)?,
            cursor: f(ne)?,
            sh_a: f(n * ff)?,
            sh_b: f(n * ff)?,
            sh_out: f(n * e)?,
            logits: f(logit_rows * cfg.n_vocab)?,
            tokens: f(n)?,
            // The argmax result, its ticket (zero between launches) and per-block parts.
            // One pick's result and scratch per verify row (argmax_rows).
            top1: g.alloc_zeroed(VERIFY_ROWS * TOP1_INTS * 4)?,
            // One token's partials, or one set per stream for a batched step's rows.
            // Partials per stream for batched sessions, per row for a verify step's one launch.
            adec: f(DecAttn::part_floats(adec_splits, cfg.n_head, d) * (if slots > 1 { SIDE_STREAMS + 1 } else { 1 }).max(brows))?,
            adec_splits,
            wh: g.alloc(wh_elems.max(1) * 2)?,
            wh_elems,
            xh: g.alloc(xh_elems * 2)?,
            ewh: g.alloc(ewh_slots * ewh_slot * 2)?,
            ewh_slot,
            ewh_slots,
            xq80: g.alloc((SIDE_STREAMS + 1) * xq80_cap)?,
            xq80d: g.alloc((SIDE_STREAMS + 1) * xq80_cap / 32 * 4)?,
            xq80_cap,
            // One token's k expert inputs, or a batched step's slots·k (decode's per-slot kernels).
            xq: g.alloc((brows * k * e.max(ff)).max(e).next_multiple_of(256))?,
            xqd: g.alloc((brows * k * e.max(ff)).max(e).div_ceil(256) * 4)?,
            gptrs: g.alloc((n * k / 64 + ne + 1) * 16)?,
            gptr_cap: n * k / 64 + ne + 1,
            // A row each for the exact rows of a batched or verify step (decode: the first).
            q8_xn: act8(brows * e, 32)?,
            q8k_xn: act8(brows * e, 256)?,
            q8_qr: act8(brows * cfg.q_lora, 32)?,
            q8_o: act8(brows * cfg.q_dim(), 32)?,
            q8_sh: act8(brows * ff, 32)?,
            gids: f((brows * cfg.o_groups).max(1))?,
            // hc_entry_dec's block records, a row's each.
            hcd_part: f(brows * hc_entry_part_floats(e, cfg.hc_mix()))?,
            // hc_entry_dec's barrier count and flag, gate_route_dec's ticket, of each row of an exact-rows launch.
            hcd_rows: g.alloc_zeroed(brows * 16)?,
            // The decode entry's (hc_entry_dec) barrier count and flag.
            hcd_bar: g.alloc_zeroed(8)?,
            // Undo copies: per layer a ring row and each frontier's rows (or two whole frontiers) per row.
            jobs: g.alloc(jobs_cap * 24)?,
            jobs_cap,
        })
        };
        // The largest candidate whose buffers leave room for the weights (and `fit.reserve`, what the
        // engine places after the stage); the last candidate is refused below if even it does not fit.
        let cands = fit.candidates();
        let (wk, n) = 'fit: {
            for (i, &n) in cands.iter().enumerate() {
                let last = i + 1 == cands.len();
                match alloc_work(n) {
                    Ok(wk) => {
                        g.sync()?;
                        if last || (plan.weights + fit.reserve) as f64 <= free_mem()? as f64 * 0.97 {
                            break 'fit (wk, n);
                        }
                    }
                    Err(e) if last => return Err(e),
                    Err(_) => {}
                }
            }
            unreachable!("the last candidate returns or breaks")
        };
        let rep: Vec<i32> = (0..brows * k).map(|j| (j / k.max(1)) as i32).collect();
        g.htod(wk.rep_tok.ptr, &rep)?;
        let gids: Vec<i32> = (0..brows * cfg.o_groups).map(|j| (j % cfg.o_groups.max(1)) as i32).collect();
        g.htod(wk.gids.ptr, &gids)?;
        let dpos_buf = g.alloc(8)?;
        // Shared-memory limits of the decode kernels are raised now: a graph capture should only record launches.
        if d % 4 == 0 && d <= 1024 {
            g.reserve_smem(DecAttn::kernel(d), DecAttn::smem(d, cfg.rope_dim / 2))?;
        }
        g.reserve_smem("idx_scores", ((cfg.idx_heads * (id + 1) + 8 * id) * 4) as u32)?;
        g.sync()?;
        let free_work = free_mem()?;
        plan.work = free_kv.saturating_sub(free_work);
        if plan.weights as f64 > free_work as f64 * 0.97 {
            return Err(refuse(&plan, "the stage's weights do not fit in the GPU's free memory"));
        }

        // The weights: one pass of large copies through pinned staging buffers, or device pointers into
        // the registered host mapping.
        let t0 = std::time::Instant::now();
        let mut weights = vec_bufs;
        let mut pinned = None;
        let ptrs: Vec<u64> = match wplace {
            WeightPlace::Device => {
                let mut ptrs = Vec::with_capacity(pending.len());
                let mut items = Vec::with_capacity(pending.len());
                for d in &pending {
                    let b = g.alloc(d.len()).map_err(|e| format!("{e} while placing the weights: serve fewer layers with --layers, or spread them over several GPUs with --cuda-devices"))?;
                    ptrs.push(b.ptr);
                    items.push((b.ptr, *d));
                    weights.push(b);
                }
                let mut last = 0u64;
                g.upload(&items, |done, tot| {
                    if done * 20 / tot.max(1) != last * 20 / tot.max(1) || done == tot {
                        eprint!("\rcuda: uploading weights {:5.1}% ({:.1} / {:.1} GiB)", 100.0 * done as f64 / tot as f64, done as f64 / GIB, tot as f64 / GIB);
                        last = done;
                    }
                })?;
                residency::count(residency::Op::Upload, items.len() as u64);
                eprintln!();
                ptrs
            }
            WeightPlace::Host => {
                let spans: Vec<(usize, usize)> = pending.iter().map(|d| (d.as_ptr() as usize, d.len())).collect();
                let p = crate::host_pin::pin(&spans)?;
                let ptrs = p.device_ptrs(&spans)?;
                eprintln!("cuda: {:.2} GiB of mapped weights registered with the GPU (read in place)", p.bytes() as f64 / GIB);
                pinned = Some(p);
                ptrs
            }
        };
        let upload_secs = t0.elapsed().as_secs_f64();
        if let Some(m) = embed.as_mut() {
            place(m, &ptrs);
        }
        for l in layers.iter_mut() {
            for m in l.mats_mut() {
                place(m, &ptrs);
            }
        }
        if let Some(h) = head.as_mut() {
            place(&mut h.hc_fn, &ptrs);
            place(&mut h.output, &ptrs);
        }
        if wplace == WeightPlace::Device {
            eprintln!("cuda: {:.2} GiB of weights resident in {:.1} s ({:.1} GB/s)", mat_bytes as f64 / GIB, upload_secs, mat_bytes as f64 / 1e9 / upload_secs.max(1e-9));
            // Q8_0 / IQ2_XXS rows to the split layout of the mv4 kernels (in place, once). Weights
            // read from the host mapping keep the file's layout (and the kernels that read it).
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
        }
        // Every kernel module loaded now: the first decode step's graph capture must only record
        // launches (loading a module synchronises, which a capture forbids).
        g.kernels_ready()?;
        let total = mat_bytes;
        let free2 = free_mem()?;
        eprintln!("cuda: {}; {:.2} GiB free after loading (ctx {ctx}, batch {n}, {slots} KV slot(s))", plan.describe(wplace), free2 as f64 / GIB);
        Ok(Self {
            cfg,
            rows: n,
            g,
            opts: stage.opts,
            range: part,
            embed,
            layers,
            head,
            kv,
            slot: 0,
            parked,
            batch: Vec::with_capacity(brows),
            batch_cap: brows,
            exact: false,
            exact_batch_rows: EXACT_BATCH_ROWS,
            same_slot: false,
            wk,
            undo_table: Vec::with_capacity(3 * jobs_cap),
            undo_cap: ucap,
            ctx,
            counts_host: vec![0; stage.cfg.n_expert],
            _weights: weights,
            _pinned: pinned,
            weight_place: wplace,
            gpu_plan: plan,
            weight_bytes: total,
            upload_secs,
            gemm_min: GEMM_MIN,
            grouped_gemm: true,
            fast_q8: stage.opts.precision == ds4_quant::Precision::Fast,
            fast_experts: stage.opts.precision == ds4_quant::Precision::Fast,
            pend: None,
            pend_rows: 1,
            ls: LayerStep::default(),
            decode_mode: false,
            dpos: dpos_buf,
            graphs: (0..slots).map(|_| Default::default()).collect(),
            batch_graphs: Vec::new(),
            capturing: false,
            host_time: host_time::HostTime::from_env(),
            staging: None,
        })
    }

}
