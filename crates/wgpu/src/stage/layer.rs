//! One resident layer: its weights (uploaded once), its KV state buffers (window ring, compressed and
//! indexer rows, compressor frontiers, their snapshot: one part per KV slot, slot s from `s` times a
//! slot's length; one checkpoint, of slot 0), and its ops built once over them and the shared work
//! buffers.
use std::sync::Arc;

use ds4_gguf::GgufFile;
use ds4_gpu::LayerInfo;
use ds4_model::kv::compressed_capacity;
use ds4_model::rope::Rope as CpuRope;
use ds4_model::weights::{CompressorWeights, LayerWeights, Mat};
use ds4_model::{Config, Weights};

use crate::buffer::GpuBuffer;
use crate::error::WgpuError;
use crate::gpu::Gpu;
use crate::ops::{
    Attention, AttentionBuffers, AttentionShape, Compressor, CompressorShape, Experts, HcPost, HcPre, Indexer, IndexerBuffers, IndexerShape, KvRow, KvRowSpec, Moe, RmsNorm,
    RouteConfig, Router, Routing, RowNorm, RowPos, RowQat, StepMatVec,
};
use crate::resident::{HostBytes, ResidentTensor};

use super::work::{hc_dims, Work};

/// The model file's mapping as host bytes a unified-memory device wraps without a copy.
struct FileBytes(Arc<GgufFile>);

impl HostBytes for FileBytes {
    fn host_bytes(&self) -> &[u8] {
        self.0.bytes()
    }
}

/// Makes the matrix `m` of `w` resident once: wrapped in place where the stage reads it from the
/// file's mapping and the device shares host memory (`ResidentTensor::from_mapping` decides), else
/// uploaded.
pub(crate) fn upload(gpu: &Gpu, w: &Weights, m: &Mat, name: &str) -> Result<ResidentTensor, WgpuError> {
    let r = w.mat(m);
    match w.file_offset(m) {
        Some(off) => ResidentTensor::from_mapping(gpu, name, r.ty, Arc::new(FileBytes(w.file.clone())), off, r.rows, r.cols),
        None => ResidentTensor::upload(gpu, name, r.ty, r.data, r.rows, r.cols),
    }
}

/// A compressor: its projections, the pooling op (which owns the frontier state) and the finishing
/// of closed windows into rows (norm, rope, QAT).
pub(crate) struct CompressorOps {
    kv: StepMatVec,
    gate: StepMatVec,
    pub op: Compressor,
    fin: KvRow,
    _w: Vec<ResidentTensor>,
    _consts: [GpuBuffer; 2],
}

impl CompressorOps {
    #[allow(clippy::too_many_arguments)]
    fn new(gpu: &Gpu, w: &Weights, cw: &CompressorWeights, name: &str, proj: [&GpuBuffer; 3], rows: &GpuBuffer, shape: CompressorShape, qat: RowQat, freqs: &[f64], eps: f32, slots: usize) -> Result<Self, WgpuError> {
        let [xn, k, g] = proj;
        let kw = upload(gpu, w, &cw.kv, &format!("{name}.kv"))?;
        let gw = upload(gpu, w, &cw.gate, &format!("{name}.gate"))?;
        let m = shape.max_tokens;
        let ape = GpuBuffer::from_slice(gpu, &format!("{name}.ape"), &cw.ape)?;
        let norm = GpuBuffer::from_slice(gpu, &format!("{name}.norm"), &cw.norm)?;
        let op = Compressor::with_slots(gpu, k, g, &ape, rows, shape, slots)?;
        let spec = KvRowSpec { dim: shape.d, norm: RowNorm::Weighted(&norm), eps, freqs, qat, rows: RowPos::Windows { ratio: shape.ratio, capacity: shape.capacity } };
        let fin = KvRow::new(gpu, rows, &spec)?;
        Ok(Self { kv: StepMatVec::new(gpu, &kw, xn, k, m)?, gate: StepMatVec::new(gpu, &gw, xn, g, m)?, op, fin, _w: vec![kw, gw], _consts: [ape, norm] })
    }

    pub fn encode(&self, enc: &mut crate::Encoder) -> Result<(), WgpuError> {
        self.kv.encode(enc)?;
        self.gate.encode(enc)?;
        self.op.encode(enc)?;
        self.fin.encode(enc)
    }
}

/// The indexer of a ratio-4 layer: its compressor, query and head weights, the scores and picks.
pub(crate) struct IndexerOps {
    pub comp: CompressorOps,
    q_b: StepMatVec,
    q_row: KvRow,
    proj: StepMatVec,
    select: Indexer,
    _w: Vec<ResidentTensor>,
}

/// The mutable state of a layer that a rewind restores: window ring and compressor frontiers (of
/// every slot, or of one: the checkpoint).
pub(crate) struct Snapshot {
    pub ring: GpuBuffer,
    pub frontiers: Vec<(GpuBuffer, GpuBuffer)>,
}

pub(crate) struct Layer {
    pub info: LayerInfo,
    pub hc_attn: HcPre,
    attn_post: HcPost,
    q_a: StepMatVec,
    q_a_norm: RmsNorm,
    q_b: StepMatVec,
    q_row: KvRow,
    kv: StepMatVec,
    kv_row: KvRow,
    pub comp: Option<CompressorOps>,
    pub idx: Option<IndexerOps>,
    attn: Attention,
    out_a: StepMatVec,
    out_b: StepMatVec,
    pub hc_ffn: HcPre,
    router: Router,
    moe: Moe,
    /// KV state: the window ring (swa rows), compressed rows, indexer rows; one part per slot.
    pub ring: GpuBuffer,
    pub comp_rows: Option<GpuBuffer>,
    pub idx_rows: Option<GpuBuffer>,
    pub snap: Snapshot,
    /// The speculative-verification checkpoint (a second saved copy).
    pub ckpt: Snapshot,
    _w: Vec<ResidentTensor>,
    _consts: Vec<GpuBuffer>,
}

/// What a layer's ops are built for.
pub(crate) struct Build<'a> {
    pub gpu: &'a Gpu,
    pub cfg: &'a Config,
    pub w: &'a Weights,
    pub work: &'a Work,
    pub nmax: u32,
    pub ctx: usize,
    pub qat: bool,
    /// KV slots (sessions resident at once).
    pub slots: usize,
}

impl Layer {
    pub fn new(b: &Build, il: usize) -> Result<Self, WgpuError> {
        let (gpu, cfg, w, wk, m, slots) = (b.gpu, b.cfg, b.w, b.work, b.nmax, b.slots.max(1));
        let lw: &LayerWeights = w.layer(il);
        let name = |t: &str| format!("blk.{il}.{t}");
        let (d, eps) = (cfg.head_dim, cfg.rms_eps);
        let ratio = cfg.ratio(il);
        let rope = CpuRope::for_layer(cfg, ratio);
        let fr = rope.freqs();
        let (fp8, fp4) = if b.qat { (RowQat::Fp8, RowQat::HadamardFp4) } else { (RowQat::None, RowQat::None) };
        let dims = hc_dims(cfg);
        let f32buf = |n: &str, v: &[f32]| GpuBuffer::from_slice(gpu, &name(n), v);
        let mut ws = Vec::new();
        let mut up = |mat: &Mat, n: &str| -> Result<usize, WgpuError> {
            ws.push(upload(gpu, w, mat, &name(n))?);
            Ok(ws.len() - 1)
        };
        let (hca, hcf) = (up(&lw.hc_attn.fn_, "hc_attn_fn")?, up(&lw.hc_ffn.fn_, "hc_ffn_fn")?);
        let (qa, qb, kvw, oa, ob) = (up(&lw.q_a, "attn_q_a")?, up(&lw.q_b, "attn_q_b")?, up(&lw.kv, "attn_kv")?, up(&lw.out_a, "attn_output_a")?, up(&lw.out_b, "attn_output_b")?);
        let gi = up(&lw.gate_inp, "ffn_gate_inp")?;
        let (ge, ue, de) = (up(&lw.gate_exps, "ffn_gate_exps")?, up(&lw.up_exps, "ffn_up_exps")?, up(&lw.down_exps, "ffn_down_exps")?);
        let shared = match &lw.shared {
            Some([g, u, dn]) => Some([up(g, "ffn_gate_shexp")?, up(u, "ffn_up_shexp")?, up(dn, "ffn_down_shexp")?]),
            None => None,
        };
        let (q_a_norm_w, kv_norm_w, sinks) = (f32buf("attn_q_a_norm", &lw.q_a_norm)?, f32buf("attn_kv_a_norm", &lw.kv_norm)?, f32buf("attn_sinks", &lw.sinks)?);

        let hc_attn = HcPre::new(gpu, &dims, &ws[hca], &lw.hc_attn.scale, &lw.hc_attn.base, &lw.attn_norm, &wk.x, &wk.mix, &wk.xn, &wk.coef, m)?;
        let attn_post = HcPost::new(gpu, &dims, &wk.x, &wk.y, &wk.coef, m)?;
        let q_a = StepMatVec::new(gpu, &ws[qa], &wk.xn, &wk.qr, m)?;
        let q_a_norm = RmsNorm::new(gpu, &wk.qr, cfg.q_lora, Some(&q_a_norm_w), eps, m)?;
        let q_b = StepMatVec::new(gpu, &ws[qb], &wk.qr, &wk.q, m)?;
        let tokens = |per_tok| RowPos::Tokens { per_tok, max_tokens: m };
        let q_row = KvRow::new(gpu, &wk.q, &KvRowSpec { dim: d, norm: RowNorm::Plain, eps, freqs: fr, qat: RowQat::None, rows: tokens(cfg.n_head) })?;
        let kv = StepMatVec::new(gpu, &ws[kvw], &wk.xn, &wk.kv, m)?;
        let kv_row = KvRow::new(gpu, &wk.kv, &KvRowSpec { dim: d, norm: RowNorm::Weighted(&kv_norm_w), eps, freqs: fr, qat: fp8, rows: tokens(1) })?;

        let cap = compressed_capacity(b.ctx, ratio);
        let ring = GpuBuffer::new(gpu, &name("kv ring"), slots * cfg.swa * d)?;
        let mut frontiers = Vec::new();
        let (mut comp, mut comp_rows, mut idx, mut idx_rows) = (None, None, None, None);
        if let Some(cw) = &lw.comp {
            let rows = GpuBuffer::new(gpu, &name("compressed rows"), slots * cap * d)?;
            let shape = CompressorShape { ratio, d, max_tokens: m, capacity: cap };
            let c = CompressorOps::new(gpu, w, cw, &name("attn_compressor"), [&wk.xn, &wk.ck, &wk.cg], &rows, shape, fp8, fr, eps, slots)?;
            frontiers.push(c.op.slot_len());
            comp = Some(c);
            comp_rows = Some(rows);
        }
        if let (Some(iw), Some(_)) = (&lw.indexer, &comp_rows) {
            let (id, ih) = (cfg.idx_dim, cfg.idx_heads);
            let rows = GpuBuffer::new(gpu, &name("indexer rows"), slots * cap * id)?;
            let shape = CompressorShape { ratio, d: id, max_tokens: m, capacity: cap };
            let c = CompressorOps::new(gpu, w, &iw.comp, &name("indexer_compressor"), [&wk.xn, &wk.ik, &wk.ig], &rows, shape, fp4, fr, eps, slots)?;
            frontiers.push(c.op.slot_len());
            let (iqw, ipw) = (upload(gpu, w, &iw.q_b, &name("indexer.attn_q_b"))?, upload(gpu, w, &iw.proj, &name("indexer.proj"))?);
            let q_b = StepMatVec::new(gpu, &iqw, &wk.qr, &wk.iq, m)?;
            let q_row = KvRow::new(gpu, &wk.iq, &KvRowSpec { dim: id, norm: RowNorm::None, eps, freqs: fr, qat: fp4, rows: tokens(ih) })?;
            let proj = StepMatVec::new(gpu, &ipw, &wk.xn, &wk.iw, m)?;
            let bufs = IndexerBuffers { q: &wk.iq, w: &wk.iw, keys: &rows, scores: &wk.scores, sel: &wk.sel };
            let select = Indexer::new(gpu, &bufs, IndexerShape { heads: ih, dim: id, ratio, top_k: cfg.idx_topk, capacity: cap, max_tokens: m })?;
            idx = Some(IndexerOps { comp: c, q_b, q_row, proj, select, _w: vec![iqw, ipw] });
            idx_rows = Some(rows);
        }
        let sel = idx.as_ref().map(|_| &wk.sel);
        let bufs = AttentionBuffers { q: &wk.q, kv: &wk.kv, ring: &ring, comp: comp_rows.as_ref(), sel, sinks: &sinks, o: &wk.o };
        let shape = AttentionShape { n_head: cfg.n_head, head_dim: d, swa: cfg.swa, ratio, top_k: if idx.is_some() { cfg.idx_topk } else { 0 }, capacity: cap, max_tokens: m };
        let attn = Attention::with_splits(gpu, &bufs, shape, fr, Some(&wk.splits))?;
        let out_a = StepMatVec::grouped(gpu, &ws[oa], &wk.o, &wk.low, m, cfg.o_lora, cfg.q_dim())?;
        let out_b = StepMatVec::new(gpu, &ws[ob], &wk.low, &wk.y, m)?;

        let hc_ffn = HcPre::new(gpu, &dims, &ws[hcf], &lw.hc_ffn.scale, &lw.hc_ffn.base, &lw.ffn_norm, &wk.x, &wk.mix, &wk.xn, &wk.coef, m)?;
        let (ne, k) = (cfg.n_expert, cfg.n_expert_used);
        let rc = RouteConfig { n_expert: ne, k, normalize: cfg.expert_weights_norm, scale: cfg.expert_weights_scale };
        let routing = match &lw.tid2eid {
            Some(t) => Routing::Hash { tid2eid: t },
            None => Routing::TopK { bias: lw.exp_bias.as_deref() },
        };
        let router = Router::new(gpu, &rc, &ws[gi], routing, &wk.xn, &wk.rlog, &wk.tokens, &wk.ids, &wk.wts, m)?;
        let experts = Experts { gate: &ws[ge], up: &ws[ue], down: &ws[de], n_expert: ne };
        let sh = shared.map(|[g, u, dn]| [&ws[g], &ws[u], &ws[dn]]);
        let moe = Moe::new(gpu, &dims, experts, sh, Some(cfg.swiglu_clamp[il]), k, &wk.xn, &wk.ids, &wk.wts, &wk.moe, &wk.x, &wk.coef, m)?;
        let saved = |label: &str, n: usize| -> Result<Snapshot, WgpuError> {
            let ring = GpuBuffer::new(gpu, label, n * cfg.swa * d)?;
            let frontiers = frontiers.iter().map(|&f| Ok((GpuBuffer::new(gpu, label, n * f)?, GpuBuffer::new(gpu, label, n * f)?))).collect::<Result<Vec<_>, WgpuError>>()?;
            Ok(Snapshot { ring, frontiers })
        };
        let (snap, ckpt) = (saved("snapshot", slots)?, saved("checkpoint", 1)?);
        let info = LayerInfo { ratio: if comp.is_some() { ratio } else { 0 }, indexer: idx.is_some(), shared_expert: lw.shared.is_some() };
        Ok(Self {
            info,
            hc_attn,
            attn_post,
            q_a,
            q_a_norm,
            q_b,
            q_row,
            kv,
            kv_row,
            comp,
            idx,
            attn,
            out_a,
            out_b,
            hc_ffn,
            router,
            moe,
            ring,
            comp_rows,
            idx_rows,
            snap,
            ckpt,
            _w: ws,
            _consts: vec![q_a_norm_w, kv_norm_w, sinks],
        })
    }

    /// The compressors of the layer in a fixed order (KV, then the indexer's): their frontiers pair
    /// with `snap.frontiers`.
    pub fn compressors(&self) -> impl Iterator<Item = &Compressor> {
        self.comp.iter().map(|c| &c.op).chain(self.idx.iter().map(|i| &i.comp.op))
    }

    pub fn kv_row(&self, enc: &mut crate::Encoder) -> Result<(), WgpuError> {
        self.kv.encode(enc)?;
        self.kv_row.encode(enc)
    }

    pub fn q_lora(&self, enc: &mut crate::Encoder) -> Result<(), WgpuError> {
        self.q_a.encode(enc)?;
        self.q_a_norm.encode(enc)
    }

    pub fn q_heads(&self, enc: &mut crate::Encoder) -> Result<(), WgpuError> {
        self.q_b.encode(enc)?;
        self.q_row.encode(enc)
    }

    pub fn indexer_query(&self, enc: &mut crate::Encoder) -> Result<(), WgpuError> {
        match &self.idx {
            Some(i) => {
                i.q_b.encode(enc)?;
                i.q_row.encode(enc)
            }
            None => Ok(()),
        }
    }

    pub fn indexer_weights(&self, enc: &mut crate::Encoder) -> Result<(), WgpuError> {
        self.idx.as_ref().map_or(Ok(()), |i| i.proj.encode(enc))
    }

    pub fn indexer_select(&self, enc: &mut crate::Encoder) -> Result<(), WgpuError> {
        self.idx.as_ref().map_or(Ok(()), |i| i.select.encode(enc))
    }

    pub fn attend(&self, enc: &mut crate::Encoder) -> Result<(), WgpuError> {
        self.attn.encode(enc)
    }

    pub fn attn_out(&self, enc: &mut crate::Encoder, steer: Option<&crate::ops::Steer>) -> Result<(), WgpuError> {
        self.out_a.encode(enc)?;
        self.out_b.encode(enc)?;
        if let Some(st) = steer {
            st.encode(enc)?;
        }
        self.attn_post.encode(enc)
    }

    pub fn route(&self, enc: &mut crate::Encoder) -> Result<(), WgpuError> {
        self.router.encode(enc)
    }

    /// Routed experts, the shared expert, their sum (steered by `steer`) and the FFN exit (one op).
    pub fn moe(&self, enc: &mut crate::Encoder, steer: Option<&crate::ops::Steer>) -> Result<(), WgpuError> {
        self.moe.encode_steered(enc, steer)
    }
}
