//! A stage: the forward pass over an owned layer range (plus embedding and head when owned).
//! Prefill and decode are the same code: a batch of `n` consecutive tokens (decode is n = 1).
use crate::attention::{attend_head, indexer_scores, top_k_indices};
use crate::compressor;
use crate::config::Config;
use crate::error::{ModelError, Result};
use crate::hc::{self, HcMix};
use crate::kv::{Buf, KvState};
use crate::moe;
use crate::ops::rms_norm;
use crate::qat;
use crate::rope::Rope;
use crate::weights::{LayerWeights, Mat, Weights};
use ds4_quant::{matmul, Precision};
use rayon::prelude::*;

/// Numerical options of a stage.
#[derive(Debug, Clone, Copy)]
pub struct Options {
    pub precision: Precision,
    /// FP8 KV and Hadamard+FP4 indexer simulation (as the official model and ds4). Tests against
    /// transformers switch it off because transformers omits these steps.
    pub qat: bool,
}

impl Default for Options {
    fn default() -> Self { Self { precision: Precision::Fast, qat: true } }
}

/// Which logits a forward call produces (only a stage that owns the head produces any).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Logits {
    None,
    Last,
    All,
}

/// Scratch buffers, grown to the largest batch seen and then reused (decode allocates nothing).
#[derive(Default)]
pub(crate) struct Work {
    x: Vec<f32>,      // n × hc_dim (HC streams)
    flat: Vec<f32>,   // n × hc_dim
    mix: Vec<f32>,    // n × hc_mix
    cur: Vec<f32>,    // n × embd
    xn: Vec<f32>,     // n × embd
    qr: Vec<f32>,     // n × q_lora
    q: Vec<f32>,      // n × q_dim
    kvb: Vec<f32>,    // n × head_dim
    ck: Vec<f32>,     // n × coff·D
    cg: Vec<f32>,     // n × coff·D
    ik: Vec<f32>,     // n × coff·idx_dim
    ig: Vec<f32>,     // n × coff·idx_dim
    iq: Vec<f32>,     // n × idx_heads·idx_dim
    iw: Vec<f32>,     // n × idx_heads
    lin: Vec<f32>,    // (swa-1+n) × head_dim, raw rows in position order
    ncomp: Vec<usize>,
    sel: Vec<Vec<u32>>,
    o: Vec<f32>,      // n × q_dim
    grp_in: Vec<f32>, // n × hpg·D
    grp_out: Vec<f32>, // n × o_lora
    low: Vec<f32>,    // n × groups·o_lora
    y: Vec<f32>,      // n × embd
    tmp: Vec<f32>,    // hc_dim
    mixes: Vec<HcMix>,
    rlog: Vec<f32>,   // n × n_expert
    eids: Vec<u32>,   // n × used
    ew: Vec<f32>,     // n × used
    ex_tok: Vec<u32>,
    ex_w: Vec<f32>,
    ex_in: Vec<f32>,
    ex_a: Vec<f32>,
    ex_b: Vec<f32>,
    ex_out: Vec<f32>,
    logits: Vec<f32>,
    row: Vec<f32>,
    crow: Vec<f32>,   // D (compressed row being emitted)
    irow: Vec<f32>,   // idx_dim
    spans: Vec<Span>, // one per sequence of the call
    tpos: Vec<usize>, // n: position of each token in its own sequence
    tseg: Vec<usize>, // n: index of each token's span
    hrows: Vec<usize>, // rows that get logits
    /// Routed-expert input statistics being collected (`Stage::collect_imatrix`).
    imatrix: Option<Box<crate::imatrix::Imatrix>>,
}

/// One sequence's share of a forward call: `n` consecutive tokens at rows `start..start + n` of the batch,
/// at positions `pos0..pos0 + n` of its own KV state; `prev` window rows from before the call precede them
/// in the raw-row buffer at row `lin0`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Span {
    pub start: usize,
    pub n: usize,
    pub pos0: usize,
    pub prev: usize,
    pub lin0: usize,
}

thread_local! {
    /// Per-thread score scratch for attention and indexer scoring (grows once, then reused).
    static SCORES: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
    /// Per-thread candidate-index scratch of the indexer top-k.
    static INDICES: std::cell::RefCell<Vec<u32>> = const { std::cell::RefCell::new(Vec::new()) };
}

fn with_scores<R>(f: impl FnOnce(&mut Vec<f32>) -> R) -> R {
    SCORES.with(|c| f(&mut c.borrow_mut()))
}

/// Element counts of every work buffer for a batch of `n` tokens: the single source for reserving them
/// at load and for the memory plan.
#[derive(Debug, Clone, Copy)]
pub struct WorkSizes {
    pub n: usize,
    f32s: [usize; 32],
    pub sel_u32: usize,
    pub eids_u32: usize,
    pub mixes: usize,
    /// Per-thread attention/indexer score scratch (floats), for the context size.
    pub scores_per_thread: usize,
}

impl WorkSizes {
    pub fn new(cfg: &Config, n: usize, ctx: usize, logit_rows: usize) -> Self {
        let (hd, e, d) = (cfg.hc_dim(), cfg.n_embd, cfg.head_dim);
        let (id, ih, k, ff) = (cfg.idx_dim, cfg.idx_heads, cfg.n_expert_used, cfg.ff_exp);
        let f32s = [
            n * hd,                  // x
            n * hd,                  // flat
            n * cfg.hc_mix(),        // mix
            n * e,                   // cur
            n * e,                   // xn
            n * cfg.q_lora,          // qr
            n * cfg.q_dim(),         // q
            n * d,                   // kvb
            n * 2 * d,               // ck
            n * 2 * d,               // cg
            n * 2 * id,              // ik
            n * 2 * id,              // ig
            n * ih * id,             // iq
            n * ih,                  // iw
            (cfg.swa - 1 + n) * d,   // lin
            n * cfg.q_dim(),         // o
            n * cfg.heads_per_group() * d, // grp_in
            n * cfg.o_lora,          // grp_out
            n * cfg.o_groups * cfg.o_lora, // low
            n * e,                   // y
            hd,                      // tmp
            n * cfg.n_expert,        // rlog
            n * k,                   // ew
            n * k,                   // ex_w
            n * e,                   // ex_in
            n * ff,                  // ex_a
            n * ff,                  // ex_b
            n * e,                   // ex_out
            logit_rows * cfg.n_vocab, // logits
            e,                       // row
            d,                       // crow
            id,                      // irow
        ];
        let max_comp = crate::kv::compressed_capacity(ctx, 4).max(cfg.swa + crate::kv::compressed_capacity(ctx, 128));
        Self { n, f32s, sel_u32: n * cfg.idx_topk, eids_u32: 2 * n * k, mixes: n, scores_per_thread: max_comp + cfg.swa }
    }

    /// Bytes of all buffers, with `threads` score scratches.
    pub fn bytes(&self, threads: usize) -> u64 {
        let f: usize = self.f32s.iter().sum();
        (4 * (f + self.sel_u32 + self.eids_u32 + self.n + 2 * threads * self.scores_per_thread)
            + self.mixes * std::mem::size_of::<HcMix>()) as u64
    }
}

impl Work {
    /// Reserves every buffer for `sz` so that batches up to `sz.n` never allocate.
    fn reserve(&mut self, sz: &WorkSizes) {
        let fields: [&mut Vec<f32>; 32] = [
            &mut self.x, &mut self.flat, &mut self.mix, &mut self.cur, &mut self.xn, &mut self.qr, &mut self.q,
            &mut self.kvb, &mut self.ck, &mut self.cg, &mut self.ik, &mut self.ig, &mut self.iq, &mut self.iw,
            &mut self.lin, &mut self.o, &mut self.grp_in, &mut self.grp_out, &mut self.low, &mut self.y,
            &mut self.tmp, &mut self.rlog, &mut self.ew, &mut self.ex_w, &mut self.ex_in, &mut self.ex_a,
            &mut self.ex_b, &mut self.ex_out, &mut self.logits, &mut self.row, &mut self.crow, &mut self.irow,
        ];
        for (v, &n) in fields.into_iter().zip(sz.f32s.iter()) {
            v.reserve_exact(n.saturating_sub(v.len()));
        }
        self.ncomp.reserve_exact(sz.n);
        self.tpos.reserve_exact(sz.n);
        self.tseg.reserve_exact(sz.n);
        self.hrows.reserve_exact(sz.n);
        self.spans.reserve_exact(1);
        self.mixes.reserve_exact(sz.mixes);
        self.eids.reserve_exact(sz.n * (sz.eids_u32 / (2 * sz.n.max(1))));
        self.ex_tok.reserve_exact(sz.n * (sz.eids_u32 / (2 * sz.n.max(1))));
        self.sel.resize(sz.n, Vec::new());
        let per = sz.sel_u32 / sz.n.max(1);
        for s in self.sel.iter_mut() {
            s.reserve_exact(per);
        }
    }
}

fn grow(v: &mut Vec<f32>, n: usize) {
    v.resize(n, 0.0);
}

pub struct Stage {
    pub cfg: Config,
    pub w: Weights,
    pub opts: Options,
    ropes: Vec<Rope>,
    work: Work,
    /// When set, the HC streams after every layer of each forward call are appended here (debugging and
    /// layer-by-layer comparison with a reference).
    pub trace: Option<Vec<Vec<f32>>>,
    /// When set, called on the computing thread after each owned layer (with its index) and after the
    /// output head (with `n_layer`) of every forward call: a progress signal (a distributed worker
    /// reports it in its heartbeats so a hung computation is told from a long one). It must be cheap
    /// (an atomic store); it cannot change results.
    pub on_progress: Option<ProgressHook>,
    /// Directional steering of the sub-layer outputs (`--dir-steering-*`); None: the plain model.
    pub steering: Option<std::sync::Arc<crate::steering::Steering>>,
    /// Whether `steering` applies to the next forward calls (a server steers some phases of a request
    /// only; shared so a token callback can switch it between decode steps).
    pub steer_gate: std::sync::Arc<std::sync::atomic::AtomicBool>,
    /// Rows of a batched step that are steered (empty: every row; rows past it are steered), while
    /// the gate is on.
    pub steer_rows: Vec<bool>,
}

/// See [`Stage::on_progress`].
pub type ProgressHook = std::sync::Arc<dyn Fn(usize) + Send + Sync>;

impl Stage {
    pub fn new(cfg: Config, w: Weights, opts: Options) -> Self {
        let ropes = (w.range.first..=w.range.last).map(|il| Rope::for_layer(&cfg, cfg.ratio(il))).collect();
        Self { cfg, w, opts, ropes, work: Work::default(), trace: None, on_progress: None, steering: None, steer_gate: std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true)), steer_rows: Vec::new() }
    }

    /// Reserves work buffers (and each rayon thread's score scratch) for batches of up to `n` tokens at
    /// context `ctx`, producing up to `logit_rows` logit rows: after this, forward calls within those
    /// bounds allocate nothing.
    pub fn reserve(&mut self, n: usize, ctx: usize, logit_rows: usize) {
        let sz = WorkSizes::new(&self.cfg, n.max(1), ctx, logit_rows.max(1));
        self.work.reserve(&sz);
        let per = sz.scores_per_thread;
        let reserve = || {
            SCORES.with(|c| c.borrow_mut().reserve_exact(per));
            INDICES.with(|c| c.borrow_mut().reserve_exact(per));
        };
        rayon::broadcast(|_| reserve());
        reserve();
    }

    pub fn new_kv(&self, ctx: usize) -> KvState {
        KvState::new(&self.cfg, self.w.range, ctx)
    }

    /// Starts collecting the routed experts' input statistics over later forward calls (ds4's
    /// `--imatrix-*`), replacing any being collected.
    pub fn collect_imatrix(&mut self) {
        let (c, r) = (&self.cfg, self.w.range);
        self.work.imatrix = Some(Box::new(crate::imatrix::Imatrix::new(r.first, r.last + 1 - r.first, c.n_expert, c.n_embd, c.ff_exp)));
    }

    /// The statistics collected since `collect_imatrix` (collection stops).
    pub fn take_imatrix(&mut self) -> Option<crate::imatrix::Imatrix> { self.work.imatrix.take().map(|b| *b) }

    /// The HC streams after the last forward call (n × hc_dim): what a non-final stage hands on.
    pub fn hidden(&self, n: usize) -> &[f32] {
        &self.work.x[..n * self.cfg.hc_dim()]
    }

    /// Runs `tokens` (consecutive positions starting at `kv.pos`) through the stage.
    /// `hidden_in` replaces the embedding for stages that don't start at layer 0.
    /// Returns the requested logits (rows of n_vocab), empty for `Logits::None` or headless stages.
    pub(crate) fn take_work(&mut self) -> Work { std::mem::take(&mut self.work) }
    pub(crate) fn put_work(&mut self, wk: Work) { self.work = wk; }
    pub(crate) fn logits_rows(&self, m: usize) -> &[f32] { &self.work.logits[..m * self.cfg.n_vocab] }

    pub fn forward(&mut self, kv: &mut KvState, tokens: &[u32], hidden_in: Option<&[f32]>, want: Logits) -> Result<&[f32]> {
        let mut wk = std::mem::take(&mut self.work);
        let res = self.forward_in(&mut wk, kv, tokens, hidden_in, want);
        self.work = wk;
        let m = res?;
        Ok(&self.work.logits[..m * self.cfg.n_vocab])
    }

    fn forward_in(&mut self, wk: &mut Work, kv: &mut KvState, tokens: &[u32], hidden_in: Option<&[f32]>, want: Logits) -> Result<usize> {
        let n = tokens.len();
        let mut one = [kv];
        self.forward_spans(wk, &mut one, &[n], tokens, hidden_in, want)
    }

    /// The forward pass over several sequences at once: sequence `s` contributes `lens[s]` consecutive
    /// tokens (in order, rows of `tokens`) at its own `kvs[s].pos`. Weight products take all rows together;
    /// KV updates, compressors, indexer and attention run per sequence on its own state, with the same
    /// arithmetic as a call for that sequence alone. `Logits::Last` gives the last row of every sequence.
    pub(crate) fn forward_spans(&mut self, wk: &mut Work, kvs: &mut [&mut KvState], lens: &[usize], tokens: &[u32], hidden_in: Option<&[f32]>, want: Logits) -> Result<usize> {
        let cfg = &self.cfg;
        let n = tokens.len();
        if kvs.len() != lens.len() || lens.iter().sum::<usize>() != n {
            return Err(ModelError::Invalid(format!("{} sequences with lengths summing to {}, for {} tokens", kvs.len(), lens.iter().sum::<usize>(), n)));
        }
        if n == 0 {
            return Ok(0);
        }
        if lens.iter().any(|&l| l == 0) {
            return Err(ModelError::Invalid("a sequence of the batch has no tokens".into()));
        }
        for (kv, &l) in kvs.iter().zip(lens) {
            if kv.pos + l > kv.ctx {
                return Err(ModelError::Invalid(format!("context full: {} + {} tokens exceeds ctx {}", kv.pos, l, kv.ctx)));
            }
            if kv.first_layer != self.w.range.first || kv.layers.len() != self.w.range.last + 1 - self.w.range.first {
                return Err(ModelError::Invalid("KV state is for another layer range".into()));
            }
        }
        self.set_spans(wk, kvs, lens);
        let hd = cfg.hc_dim();
        grow(&mut wk.x, n * hd);
        match (hidden_in, self.w.embed.is_some()) {
            (Some(h), _) => {
                if h.len() != n * hd {
                    return Err(ModelError::Invalid(format!("hidden input has {} floats, expected {}", h.len(), n * hd)));
                }
                wk.x.copy_from_slice(h);
            }
            (None, true) => {
                let e = cfg.n_embd;
                grow(&mut wk.row, e);
                for (i, &t) in tokens.iter().enumerate() {
                    self.w.embed_row(t, &mut wk.row)?;
                    for s in 0..cfg.n_hc {
                        let o = i * hd + s * e;
                        wk.x[o..o + e].copy_from_slice(&wk.row);
                    }
                }
            }
            (None, false) => return Err(ModelError::Invalid("stage without embedding needs a hidden-state input".into())),
        }
        self.run_layers(wk, kvs, tokens, want)
    }

    /// Lays out the spans and each token's position and sequence for this call.
    fn set_spans(&self, wk: &mut Work, kvs: &[&mut KvState], lens: &[usize]) {
        let swa = self.cfg.swa;
        wk.spans.clear();
        wk.tpos.clear();
        wk.tseg.clear();
        let (mut start, mut lin0) = (0, 0);
        for (s, (kv, &n)) in kvs.iter().zip(lens).enumerate() {
            let prev = kv.pos.min(swa - 1);
            wk.spans.push(Span { start, n, pos0: kv.pos, prev, lin0 });
            wk.tpos.extend(kv.pos..kv.pos + n);
            wk.tseg.extend(std::iter::repeat_n(s, n));
            start += n;
            lin0 += prev + n;
        }
    }

    /// All owned layers, then the head; returns how many logit rows were produced.
    fn run_layers(&mut self, wk: &mut Work, kvs: &mut [&mut KvState], tokens: &[u32], want: Logits) -> Result<usize> {
        let n = tokens.len();
        let hd = self.cfg.hc_dim();
        for il in self.w.range.first..=self.w.range.last {
            self.attention_block(wk, il, kvs, n)?;
            self.ffn_block(wk, il, tokens, n)?;
            if let Some(t) = self.trace.as_mut() {
                t.push(wk.x[..n * hd].to_vec());
            }
            if let Some(p) = &self.on_progress {
                p(il);
            }
        }
        for (kv, sp) in kvs.iter_mut().zip(&wk.spans) {
            kv.pos += sp.n;
        }
        if want == Logits::None || self.w.head.is_none() {
            return Ok(0);
        }
        let mut rows = std::mem::take(&mut wk.hrows);
        rows.clear();
        match want {
            Logits::All => rows.extend(0..n),
            _ => rows.extend(wk.spans.iter().map(|sp| sp.start + sp.n - 1)),
        }
        let r = self.head(wk, &rows);
        let m = rows.len();
        wk.hrows = rows;
        r?;
        if let Some(p) = &self.on_progress {
            p(self.cfg.n_layer);
        }
        Ok(m)
    }

    fn mm(&self, m: &Mat, x: &[f32], n: usize, y: &mut [f32]) {
        matmul(&self.w.mat(m), x, n, y, self.opts.precision);
    }

    /// HC-pre for all tokens into `work.cur`, mixes into `work.mixes`.
    fn hc_pre(&self, wk: &mut Work, lw_hc: &crate::weights::HcWeights, n: usize) {
        let cfg = &self.cfg;
        let (hd, e, nm) = (cfg.hc_dim(), cfg.n_embd, cfg.hc_mix());
        grow(&mut wk.flat, n * hd);
        grow(&mut wk.mix, n * nm);
        grow(&mut wk.cur, n * e);
        for i in 0..n {
            hc::flat_norm(&wk.x[i * hd..(i + 1) * hd], &mut wk.flat[i * hd..(i + 1) * hd], cfg.rms_eps);
        }
        matmul(&self.w.mat(&lw_hc.fn_), &wk.flat, n, &mut wk.mix, self.opts.precision);
        wk.mixes.resize(n, HcMix::default());
        for i in 0..n {
            wk.mixes[i] = hc::pre_from_mix(
                &wk.mix[i * nm..(i + 1) * nm],
                &lw_hc.scale,
                &lw_hc.base,
                cfg.n_hc,
                cfg.sinkhorn_iters,
                cfg.hc_eps,
                &wk.x[i * hd..(i + 1) * hd],
                &mut wk.cur[i * e..(i + 1) * e],
            );
        }
    }

    /// The steering edit of the sub-layer output `work.y` (before it enters the streams).
    fn steer(&self, il: usize, site: crate::steering::Site, wk: &mut Work, n: usize) {
        let Some(st) = self.steering.as_ref().filter(|_| self.steer_gate.load(std::sync::atomic::Ordering::Relaxed)) else { return };
        let e = self.cfg.n_embd;
        if self.steer_rows.is_empty() {
            st.apply(il, site, &mut wk.y[..n * e]);
        } else {
            // Rows past the mask are steered, as on a device.
            for (r, row) in wk.y[..n * e].chunks_exact_mut(e).enumerate() {
                if self.steer_rows.get(r).is_none_or(|&on| on) {
                    st.apply(il, site, row);
                }
            }
        }
    }

    /// HC-post of `work.y` into the streams.
    fn hc_post(&self, wk: &mut Work, n: usize) {
        let cfg = &self.cfg;
        let (hd, e) = (cfg.hc_dim(), cfg.n_embd);
        grow(&mut wk.tmp, hd);
        for i in 0..n {
            hc::post(&wk.mixes[i], cfg.n_hc, &wk.y[i * e..(i + 1) * e], &mut wk.x[i * hd..(i + 1) * hd], &mut wk.tmp);
        }
    }

    fn attention_block(&self, wk: &mut Work, il: usize, kvs: &mut [&mut KvState], n: usize) -> Result<()> {
        let lw = self.w.layer(il);
        let cfg = &self.cfg;
        let rope = &self.ropes[il - self.w.range.first];
        let (e, d, nh) = (cfg.n_embd, cfg.head_dim, cfg.n_head);
        let qd = cfg.q_dim();
        let qat_on = self.opts.qat;

        self.hc_pre(wk, &lw.hc_attn, n);
        {
                grow(&mut wk.xn, n * e);
            wk.xn.copy_from_slice(&wk.cur[..n * e]);
            for i in 0..n {
                rms_norm(&mut wk.xn[i * e..(i + 1) * e], Some(&lw.attn_norm), cfg.rms_eps);
            }
        }
        // Q path: low rank, norm, expand, per-head unweighted norm, rope.
        let mut qr = std::mem::take(&mut wk.qr);
        let mut q = std::mem::take(&mut wk.q);
        let mut kvb = std::mem::take(&mut wk.kvb);
        grow(&mut qr, n * cfg.q_lora);
        grow(&mut q, n * qd);
        grow(&mut kvb, n * d);
        self.mm(&lw.q_a, &wk.xn, n, &mut qr);
        for i in 0..n {
            rms_norm(&mut qr[i * cfg.q_lora..(i + 1) * cfg.q_lora], Some(&lw.q_a_norm), cfg.rms_eps);
        }
        self.mm(&lw.q_b, &qr, n, &mut q);
        let tpos = &wk.tpos;
        q.par_chunks_mut(d).enumerate().for_each(|(k, h)| {
            rms_norm(h, None, cfg.rms_eps);
            rope.apply(h, tpos[k / nh], false);
        });
        // Shared KV row: project, norm, rope, FP8 on the non-rope part.
        self.mm(&lw.kv, &wk.xn, n, &mut kvb);
        for i in 0..n {
            let r = &mut kvb[i * d..(i + 1) * d];
            rms_norm(r, Some(&lw.kv_norm), cfg.rms_eps);
            rope.apply(r, wk.tpos[i], false);
            if qat_on {
                qat::fp8_simulate(&mut r[..cfg.nope_dim()], 64);
            }
        }

        // Raw rows in position order, per sequence: its previous swa-1 positions from its ring, then its
        // tokens of this call.
        let swa = cfg.swa;
        {
            let lin = &mut wk.lin;
            let last = wk.spans.last().expect("spans");
            grow(lin, (last.lin0 + last.prev + last.n) * d);
            for (sp, kv) in wk.spans.iter().zip(kvs.iter_mut()) {
                let li = il - kv.first_layer;
                let (lkv, mut journal) = kv.layer_journal(il);
                let (pos0, prev, n, l0) = (sp.pos0, sp.prev, sp.n, sp.lin0);
                for j in 0..prev {
                    let p = pos0 - prev + j;
                    let src = (p % swa) * d;
                    lin[(l0 + j) * d..(l0 + j + 1) * d].copy_from_slice(&lkv.raw[src..src + d]);
                }
                lin[(l0 + prev) * d..(l0 + prev + n) * d].copy_from_slice(&kvb[sp.start * d..(sp.start + n) * d]);
                for i in n.saturating_sub(swa)..n {
                    let p = pos0 + i;
                    let dst = (p % swa) * d;
                    if let Some(j) = journal.as_deref_mut() {
                        j.save(p, li, Buf::Raw, &lkv.raw, dst, d);
                    }
                    lkv.raw[dst..dst + d].copy_from_slice(&kvb[(sp.start + i) * d..(sp.start + i + 1) * d]);
                }
            }
        }

        // Compressors (sequential in position) and, for ratio-4 layers, the indexer selection.
        wk.ncomp.clear();
        wk.sel.resize(n, Vec::new());
        if let Some(cw) = &lw.comp {
            let coff = cfg.compress_coff(il);
            let wd = coff * d;
            let mut ck = std::mem::take(&mut wk.ck);
            let mut cg = std::mem::take(&mut wk.cg);
            grow(&mut ck, n * wd);
            grow(&mut cg, n * wd);
            self.mm(&cw.kv, &wk.xn, n, &mut ck);
            self.mm(&cw.gate, &wk.xn, n, &mut cg);
            let mut idx_proj = None;
            if let Some(iw) = &lw.indexer {
                let id = cfg.idx_dim;
                let mut ik = std::mem::take(&mut wk.ik);
                let mut ig = std::mem::take(&mut wk.ig);
                grow(&mut ik, n * coff * id);
                grow(&mut ig, n * coff * id);
                self.mm(&iw.comp.kv, &wk.xn, n, &mut ik);
                self.mm(&iw.comp.gate, &wk.xn, n, &mut ig);
                idx_proj = Some((ik, ig));
            }
            let mut row = std::mem::take(&mut wk.crow);
            let mut irow = std::mem::take(&mut wk.irow);
            grow(&mut row, d);
            grow(&mut irow, cfg.idx_dim);
            for i in 0..n {
                let pos = wk.tpos[i];
                let kv = &mut *kvs[wk.tseg[i]];
                let li = il - kv.first_layer;
                let (lkv, mut journal) = kv.layer_journal(il);
                let st = lkv.comp_state.as_mut().expect("compressor state");
                if let Some(j) = journal.as_deref_mut() {
                    let t = compressor::touched(st, pos);
                    j.save(pos, li, Buf::CompKv, &st.kv, t.start, t.len());
                    j.save(pos, li, Buf::CompScore, &st.score, t.start, t.len());
                }
                if compressor::push(st, pos, &ck[i * wd..(i + 1) * wd], &cg[i * wd..(i + 1) * wd], &cw.ape, &cw.norm, cfg.rms_eps, &rope, &mut row) {
                    if qat_on {
                        qat::fp8_simulate(&mut row[..cfg.nope_dim()], 64);
                    }
                    lkv.comp.as_mut().expect("compressed rows").push(&row);
                }
                if let (Some(iw), Some((ik, ig))) = (&lw.indexer, &idx_proj) {
                    let iwd = coff * cfg.idx_dim;
                    let ist = lkv.idx_state.as_mut().expect("indexer state");
                    if let Some(j) = journal.as_deref_mut() {
                        let t = compressor::touched(ist, pos);
                        j.save(pos, li, Buf::IdxKv, &ist.kv, t.start, t.len());
                        j.save(pos, li, Buf::IdxScore, &ist.score, t.start, t.len());
                    }
                    if compressor::push(ist, pos, &ik[i * iwd..(i + 1) * iwd], &ig[i * iwd..(i + 1) * iwd], &iw.comp.ape, &iw.comp.norm, cfg.rms_eps, &rope, &mut irow) {
                        if qat_on {
                            qat::hadamard(&mut irow);
                            qat::fp4_simulate(&mut irow, 32);
                        }
                        lkv.idx.as_mut().expect("indexer rows").push(&irow);
                    }
                }
                wk.ncomp.push(lkv.comp.as_ref().map_or(0, |c| c.n));
            }
            wk.ck = ck;
            wk.cg = cg;
            wk.crow = row;
            wk.irow = irow;
            if let Some((ik, ig)) = idx_proj {
                wk.ik = ik;
                wk.ig = ig;
            }
        } else {
            wk.ncomp.resize(n, 0);
        }

        // Indexer top-k for tokens that see more compressed rows than top_k.
        if let Some(iw) = &lw.indexer {
            let needs = wk.ncomp.iter().any(|&c| c > cfg.idx_topk);
            if needs {
                let (ih, id) = (cfg.idx_heads, cfg.idx_dim);
                let mut iq = std::mem::take(&mut wk.iq);
                let mut iwt = std::mem::take(&mut wk.iw);
                grow(&mut iq, n * ih * id);
                grow(&mut iwt, n * ih);
                self.mm(&iw.q_b, &qr, n, &mut iq);
                self.mm(&iw.proj, &wk.xn, n, &mut iwt);
                let wscale = 1.0 / ((id * ih) as f32).sqrt();
                let tpos = &wk.tpos;
                iq.par_chunks_mut(id).enumerate().for_each(|(k, h)| {
                    rope.apply(h, tpos[k / ih], false);
                    if qat_on {
                        qat::hadamard(h);
                        qat::fp4_simulate(h, 32);
                    }
                });
                iwt.iter_mut().for_each(|v| *v *= wscale);
                let lkvs = layer_views(kvs, il);
                let tseg = &wk.tseg;
                let ncomp = &wk.ncomp;
                let topk = cfg.idx_topk;
                wk.sel.par_iter_mut().enumerate().for_each(|(i, sel)| with_scores(|scores| {
                    let nc = ncomp[i];
                    if nc > topk {
                        let keys = &lkvs[tseg[i]].idx.as_ref().expect("indexer rows").data;
                        indexer_scores(&iq[i * ih * id..(i + 1) * ih * id], &iwt[i * ih..(i + 1) * ih], keys, id, nc, scores);
                        INDICES.with(|ix| top_k_indices(scores, topk, &mut ix.borrow_mut(), sel));
                    } else {
                        sel.clear();
                    }
                }));
                wk.iq = iq;
                wk.iw = iwt;
            } else {
                wk.sel.iter_mut().for_each(|s| s.clear());
            }
        }

        // Attention of every (token, head) pair.
        let mut o = std::mem::take(&mut wk.o);
        grow(&mut o, n * qd);
        {
            let lin = &wk.lin;
            let lkvs = layer_views(kvs, il);
            let (spans, tseg, tpos) = (&wk.spans, &wk.tseg, &wk.tpos);
            let ncomp = &wk.ncomp;
            let sel = &wk.sel;
            let topk = cfg.idx_topk;
            let is_idx = lw.indexer.is_some();
            o.par_chunks_mut(d).enumerate().for_each(|(k, out)| with_scores(|scores| {
                let (i, h) = (k / nh, k % nh);
                let sp = &spans[tseg[i]];
                let comp = lkvs[tseg[i]].comp.as_ref();
                // Row of token i within its sequence's raw rows.
                let li = sp.prev + i - sp.start;
                let lo = (li + 1).saturating_sub(swa);
                let raw = (sp.lin0 + lo..=sp.lin0 + li).map(|j| &lin[j * d..(j + 1) * d]);
                let nc = ncomp[i];
                let qh = &q[i * qd + h * d..i * qd + (h + 1) * d];
                let sink = lw.sinks[h];
                match comp {
                    Some(c) if is_idx && nc > topk => {
                        let rows = raw.chain(sel[i].iter().map(|&r| c.row(r as usize)));
                        attend_head(qh, rows, sink, scores, out);
                    }
                    Some(c) => {
                        let rows = raw.chain((0..nc).map(|r| c.row(r)));
                        attend_head(qh, rows, sink, scores, out);
                    }
                    None => attend_head(qh, raw, sink, scores, out),
                }
                rope.apply(out, tpos[i], true);
            }));
        }

        // Grouped low-rank output projection, then the second projection.
        let (g, hpg, ol) = (cfg.o_groups, cfg.heads_per_group(), cfg.o_lora);
        let gin = hpg * d;
        {
                grow(&mut wk.grp_in, n * gin);
            grow(&mut wk.grp_out, n * ol);
            grow(&mut wk.low, n * g * ol);
            grow(&mut wk.y, n * e);
        }
        let out_a = self.w.mat(&lw.out_a);
        for gi in 0..g {
                for i in 0..n {
                wk.grp_in[i * gin..(i + 1) * gin].copy_from_slice(&o[i * qd + gi * gin..i * qd + (gi + 1) * gin]);
            }
            let sub = out_a.rows_slice(gi * ol, (gi + 1) * ol);
            matmul(&sub, &wk.grp_in, n, &mut wk.grp_out, self.opts.precision);
            for i in 0..n {
                wk.low[i * g * ol + gi * ol..i * g * ol + (gi + 1) * ol].copy_from_slice(&wk.grp_out[i * ol..(i + 1) * ol]);
            }
        }
        let mut y = std::mem::take(&mut wk.y);
        self.mm(&lw.out_b, &wk.low, n, &mut y);
        wk.y = y;
        wk.qr = qr;
        wk.q = q;
        wk.kvb = kvb;
        wk.o = o;
        self.steer(il, crate::steering::Site::Attn, wk, n);
        self.hc_post(wk, n);
        Ok(())
    }

    fn ffn_block(&self, wk: &mut Work, il: usize, tokens: &[u32], n: usize) -> Result<()> {
        let lw: &LayerWeights = self.w.layer(il);
        let cfg = &self.cfg;
        let (e, ne, k, ff) = (cfg.n_embd, cfg.n_expert, cfg.n_expert_used, cfg.ff_exp);
        let clamp = cfg.swiglu_clamp[il];
        self.hc_pre(wk, &lw.hc_ffn, n);
        let mut xn = std::mem::take(&mut wk.xn);
        grow(&mut xn, n * e);
        xn.copy_from_slice(&wk.cur[..n * e]);
        for i in 0..n {
            rms_norm(&mut xn[i * e..(i + 1) * e], Some(&lw.ffn_norm), cfg.rms_eps);
        }
        // Router.
        let mut rlog = std::mem::take(&mut wk.rlog);
        grow(&mut rlog, n * ne);
        self.mm(&lw.gate_inp, &xn, n, &mut rlog);
        wk.eids.resize(n * k, 0);
        grow(&mut wk.ew, n * k);
        for i in 0..n {
            let hash = lw.tid2eid.as_ref().map(|t| {
                let tok = tokens[i] as usize;
                &t[tok * k..(tok + 1) * k]
            });
            if hash.is_some() && tokens[i] as usize >= cfg.n_vocab {
                return Err(ModelError::Invalid(format!("token id {} is outside the vocabulary", tokens[i])));
            }
            moe::route(
                &rlog[i * ne..(i + 1) * ne],
                lw.exp_bias.as_deref(),
                hash,
                k,
                cfg.expert_weights_norm,
                cfg.expert_weights_scale,
                &mut wk.eids[i * k..(i + 1) * k],
                &mut wk.ew[i * k..(i + 1) * k],
            );
        }
        wk.rlog = rlog;
        // Routed experts, grouped by expert over the batch.
        grow(&mut wk.y, n * e);
        wk.y.fill(0.0);
        for ex in 0..ne {
            wk.ex_tok.clear();
            wk.ex_w.clear();
            for i in 0..n {
                for s in 0..k {
                    if wk.eids[i * k + s] as usize == ex {
                        wk.ex_tok.push(i as u32);
                        wk.ex_w.push(wk.ew[i * k + s]);
                    }
                }
            }
            let m = wk.ex_tok.len();
            if m == 0 {
                continue;
            }
            grow(&mut wk.ex_in, m * e);
            for (j, &i) in wk.ex_tok.iter().enumerate() {
                let i = i as usize;
                wk.ex_in[j * e..(j + 1) * e].copy_from_slice(&xn[i * e..(i + 1) * e]);
            }
            grow(&mut wk.ex_a, m * ff);
            grow(&mut wk.ex_b, m * ff);
            grow(&mut wk.ex_out, m * e);
            let p = self.opts.precision;
            matmul(&self.w.expert(&lw.gate_exps, ex), &wk.ex_in, m, &mut wk.ex_a, p);
            matmul(&self.w.expert(&lw.up_exps, ex), &wk.ex_in, m, &mut wk.ex_b, p);
            for j in 0..m {
                let wt = wk.ex_w[j];
                for c in 0..ff {
                    let idx = j * ff + c;
                    wk.ex_a[idx] = moe::swiglu_clamped(wk.ex_a[idx], wk.ex_b[idx], clamp) * wt;
                }
            }
            if let Some(im) = wk.imatrix.as_mut() {
                im.observe(il, ex, &wk.ex_in[..m * e], &wk.ex_a[..m * ff]);
            }
            matmul(&self.w.expert(&lw.down_exps, ex), &wk.ex_a, m, &mut wk.ex_out, p);
            for (j, &i) in wk.ex_tok.iter().enumerate() {
                let i = i as usize;
                let src = &wk.ex_out[j * e..(j + 1) * e];
                wk.y[i * e..(i + 1) * e].iter_mut().zip(src).for_each(|(d, &s)| *d += s);
            }
        }
        // Shared expert, weight 1.
        if let Some([g, u, dn]) = &lw.shared {
            let p = self.opts.precision;
            grow(&mut wk.ex_a, n * ff);
            grow(&mut wk.ex_b, n * ff);
            grow(&mut wk.ex_out, n * e);
            matmul(&self.w.mat(g), &xn, n, &mut wk.ex_a, p);
            matmul(&self.w.mat(u), &xn, n, &mut wk.ex_b, p);
            for idx in 0..n * ff {
                wk.ex_a[idx] = moe::swiglu_clamped(wk.ex_a[idx], wk.ex_b[idx], clamp);
            }
            matmul(&self.w.mat(dn), &wk.ex_a[..n * ff], n, &mut wk.ex_out[..n * e], p);
            wk.y.iter_mut().zip(&wk.ex_out[..n * e]).for_each(|(d, &s)| *d += s);
        }
        wk.xn = xn;
        if let Some(im) = wk.imatrix.as_mut() {
            im.chunks += 1;
        }
        self.steer(il, crate::steering::Site::Ffn, wk, n);
        self.hc_post(wk, n);
        Ok(())
    }

    fn head(&self, wk: &mut Work, rows: &[usize]) -> Result<()> {
        let cfg = &self.cfg;
        let hw = self.w.head.as_ref().expect("head");
        let (hd, e, v) = (cfg.hc_dim(), cfg.n_embd, cfg.n_vocab);
        let m = rows.len();
        grow(&mut wk.flat, m * hd);
        grow(&mut wk.mix, m * cfg.n_hc);
        grow(&mut wk.cur, m * e);
        for (j, &i) in rows.iter().enumerate() {
            hc::flat_norm(&wk.x[i * hd..(i + 1) * hd], &mut wk.flat[j * hd..(j + 1) * hd], cfg.rms_eps);
        }
        let p = self.opts.precision;
        matmul(&self.w.mat(&hw.hc_fn), &wk.flat[..m * hd], m, &mut wk.mix[..m * cfg.n_hc], p);
        for (j, &i) in rows.iter().enumerate() {
            let out = &mut wk.cur[j * e..(j + 1) * e];
            hc::head_collapse(&wk.mix[j * cfg.n_hc..(j + 1) * cfg.n_hc], hw.hc_scale[0], &hw.hc_base, cfg.hc_eps, &wk.x[i * hd..(i + 1) * hd], out);
            rms_norm(out, Some(&hw.norm), cfg.rms_eps);
        }
        grow(&mut wk.logits, m * v);
        matmul(&self.w.mat(&hw.output), &wk.cur[..m * e], m, &mut wk.logits, p);
        Ok(())
    }
}

/// Shared views of every sequence's state of layer `il` (for the parallel read-only phases).
fn layer_views<'a>(kvs: &'a [&mut KvState], il: usize) -> Vec<&'a crate::kv::LayerKv> {
    kvs.iter().map(|kv| &kv.layers[il - kv.first_layer]).collect()
}
