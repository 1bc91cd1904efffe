//! Binding of ds4-named GGUF tensors to the parts of a stage (a layer range, plus embedding/head).
use crate::config::Config;
use crate::error::{ModelError, Result};
use ds4_gguf::{GgmlType, GgufFile, TensorInfo};
use ds4_quant::MatRef;
use crate::hostload::{load_spans, HostLoad};
pub use crate::hostload::{Region, WeightMemory};
use crate::mapplan::MapPlan;
use crate::residency;
use std::cell::RefCell;
use std::ops::Range;
use std::path::Path;
use std::sync::Arc;

/// A matrix (or a stack of expert matrices) living in the mapped file.
#[derive(Debug, Clone)]
pub struct Mat {
    pub ty: GgmlType,
    /// Output rows per matrix.
    pub rows: usize,
    /// Input columns.
    pub cols: usize,
    /// Number of stacked matrices (experts); 1 for plain matrices.
    pub n_mat: usize,
    /// Absolute byte range in the file.
    pub start: usize,
    pub len: usize,
    /// Mapping of the map plan that holds it, and the offset inside that mapping.
    pub map: usize,
    pub off: usize,
}

impl Mat {
    pub fn bytes_per_mat(&self) -> usize { self.len / self.n_mat }
}

/// Compressor weights (attention or indexer).
#[derive(Debug, Clone)]
pub struct CompressorWeights {
    /// `ratio` rows of `coff·D` position biases.
    pub ape: Vec<f32>,
    pub kv: Mat,
    pub gate: Mat,
    pub norm: Vec<f32>,
}

#[derive(Debug, Clone)]
pub struct IndexerWeights {
    pub q_b: Mat,
    pub proj: Mat,
    pub comp: CompressorWeights,
}

/// Hyper-connection mixing parameters of one sub-layer.
#[derive(Debug, Clone)]
pub struct HcWeights {
    pub fn_: Mat,
    pub scale: Vec<f32>,
    pub base: Vec<f32>,
}

#[derive(Debug, Clone)]
pub struct LayerWeights {
    pub il: usize,
    pub hc_attn: HcWeights,
    pub attn_norm: Vec<f32>,
    pub q_a: Mat,
    pub q_a_norm: Vec<f32>,
    pub q_b: Mat,
    pub kv: Mat,
    pub kv_norm: Vec<f32>,
    pub sinks: Vec<f32>,
    pub out_a: Mat,
    pub out_b: Mat,
    pub comp: Option<CompressorWeights>,
    pub indexer: Option<IndexerWeights>,
    pub hc_ffn: HcWeights,
    pub ffn_norm: Vec<f32>,
    pub gate_inp: Mat,
    pub exp_bias: Option<Vec<f32>>,
    /// Hash routing table: `n_vocab` rows of `n_expert_used` expert ids.
    pub tid2eid: Option<Vec<u32>>,
    pub gate_exps: Mat,
    pub up_exps: Mat,
    pub down_exps: Mat,
    pub shared: Option<[Mat; 3]>,
}

#[derive(Debug, Clone)]
pub struct HeadWeights {
    pub hc_fn: Mat,
    pub hc_scale: Vec<f32>,
    pub hc_base: Vec<f32>,
    pub norm: Vec<f32>,
    pub output: Mat,
}

/// The MTP block's own input and head tensors (`mtp.0.*`); its transformer block is a `LayerWeights`.
#[derive(Debug, Clone)]
pub struct MtpHeadWeights {
    pub e_proj: Mat,
    pub h_proj: Mat,
    pub enorm: Vec<f32>,
    pub hnorm: Vec<f32>,
    pub norm: Vec<f32>,
    pub hc_fn: Mat,
    pub hc_scale: Vec<f32>,
    pub hc_base: Vec<f32>,
}

/// Tensor-name prefix of the MTP block in the MTP GGUF.
pub const MTP_PREFIX: &str = "mtp.0.";

/// Inclusive layer range of a stage, with the optional ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LayerRange {
    pub first: usize,
    pub last: usize,
    pub embed: bool,
    pub head: bool,
}

impl LayerRange {
    pub fn full(cfg: &Config) -> Self {
        Self { first: 0, last: cfg.n_layer - 1, embed: true, head: true }
    }
    pub fn contains(&self, il: usize) -> bool { il >= self.first && il <= self.last }

    /// Parses the C engine's `A:B` (inclusive) or `A:output` (through the last layer, with the head).
    /// The embedding belongs to a range that starts at layer 0.
    pub fn parse(s: &str, n_layer: usize) -> Result<Self> {
        let bad = |why: String| ModelError::Invalid(format!("--layers `{s}`: {why}"));
        let (a, b) = s.split_once(':').ok_or_else(|| bad("expected A:B or A:output".into()))?;
        let first: usize = a.trim().parse().map_err(|_| bad(format!("`{a}` is not a layer number")))?;
        let (last, head) = if b.trim() == "output" {
            (n_layer.saturating_sub(1), true)
        } else {
            (b.trim().parse().map_err(|_| bad(format!("`{b}` is not a layer number or `output`")))?, false)
        };
        if first > last || last >= n_layer {
            return Err(bad(format!("the model has layers 0..{}", n_layer.saturating_sub(1))));
        }
        Ok(Self { first, last, embed: first == 0, head })
    }

    /// `A:B` or `A:output`, as parsed.
    pub fn label(&self) -> String {
        if self.head { format!("{}:output", self.first) } else { format!("{}:{}", self.first, self.last) }
    }
}

/// All weights a stage owns, bound to the mappings of its map plan.
pub struct Weights {
    pub file: Arc<GgufFile>,
    pub range: LayerRange,
    pub embed: Option<Mat>,
    pub layers: Vec<LayerWeights>,
    pub head: Option<HeadWeights>,
    /// The MTP block's input and head tensors (only in weights bound from an MTP file).
    pub mtp: Option<MtpHeadWeights>,
    pub plan: MapPlan,
    regions: Vec<Region>,
}

impl Weights {
    fn region(&self, i: usize) -> &[u8] {
        match &self.regions[i] {
            Region::Mapped(m) => m,
            Region::Anon(m) => m,
            Region::Window(r) => &self.file.bytes()[r.clone()],
        }
    }

    pub fn mat<'a>(&'a self, m: &Mat) -> MatRef<'a> {
        MatRef { ty: m.ty, data: &self.region(m.map)[m.off..m.off + m.len], rows: m.rows * m.n_mat, cols: m.cols }
    }
    /// Matrix `e` of a stacked expert tensor.
    pub fn expert<'a>(&'a self, m: &Mat, e: usize) -> MatRef<'a> {
        let b = m.bytes_per_mat();
        let s = m.off + e * b;
        MatRef { ty: m.ty, data: &self.region(m.map)[s..s + b], rows: m.rows, cols: m.cols }
    }

    /// Number of mappings the stage's weights live in.
    pub fn n_mappings(&self) -> usize { self.regions.len() }

    /// Where matrix `m` lies in the model file's own mapping, when the stage reads it there (weights
    /// bound without a copy): its byte offset in `self.file.bytes()`.
    pub fn file_offset(&self, m: &Mat) -> Option<usize> {
        match &self.regions[m.map] {
            Region::Window(r) if self.file.is_mapped() => Some(r.start + m.off),
            _ => None,
        }
    }

    /// Bytes of all tensors the stage owns (what becomes resident).
    pub fn resident_bytes(&self) -> u64 { self.plan.bytes() }

    /// Weight bytes one decode step reads: every dense matrix of the owned layers, `n_expert_used`
    /// experts' matrices per layer, the head, one embedding row. `indexer_active` says whether the
    /// indexer scores rows (more compressed rows than its top-k).
    pub fn decode_bytes(&self, n_expert_used: usize, indexer_active: bool) -> u64 {
        let mut b = 0usize;
        for l in &self.layers {
            b += l.hc_attn.fn_.len + l.hc_ffn.fn_.len + l.q_a.len + l.q_b.len + l.kv.len + l.out_a.len + l.out_b.len;
            b += l.gate_inp.len;
            if let Some(c) = &l.comp {
                b += c.kv.len + c.gate.len;
            }
            if let Some(i) = &l.indexer {
                b += i.comp.kv.len + i.comp.gate.len;
                if indexer_active {
                    b += i.q_b.len + i.proj.len;
                }
            }
            if let Some(sh) = &l.shared {
                b += sh.iter().map(|m| m.len).sum::<usize>();
            }
            b += n_expert_used * (l.gate_exps.bytes_per_mat() + l.up_exps.bytes_per_mat() + l.down_exps.bytes_per_mat());
        }
        if let Some(h) = &self.head {
            b += h.hc_fn.len + h.output.len;
        }
        if let Some(e) = &self.embed {
            b += e.len / e.rows.max(1);
        }
        b as u64
    }

    pub fn layer(&self, il: usize) -> &LayerWeights {
        &self.layers[il - self.range.first]
    }

    /// Binds the stage's tensors inside the file's own bytes (one window per map-plan span).
    pub fn bind(file: Arc<GgufFile>, cfg: &Config, range: LayerRange) -> Result<Self> {
        Self::bind_from(file, None, cfg, range)
    }

    /// Binds the stage's tensors and copies only the coalesced spans of its map plan from `path` into
    /// memory (the CPU default; see `WeightMemory`).
    pub fn bind_mapped(file: Arc<GgufFile>, path: &Path, cfg: &Config, range: LayerRange) -> Result<Self> {
        Self::bind_from(file, Some((path, &HostLoad::copy())), cfg, range)
    }

    /// Like `bind_mapped`, bringing the spans in as `load` says.
    pub fn bind_with(file: Arc<GgufFile>, path: &Path, cfg: &Config, range: LayerRange, load: &HostLoad) -> Result<Self> {
        Self::bind_from(file, Some((path, load)), cfg, range)
    }

    /// The map plan of a stage, from the tensor directory alone: checks that every tensor the stage
    /// needs is present with the right shape and type, and reads no tensor data (the memory plan is
    /// made from it before any weight is loaded).
    pub fn map_plan(file: &GgufFile, cfg: &Config, range: LayerRange) -> Result<MapPlan> {
        check_range(file, cfg, range)?;
        let b = Binder { f: file, cfg, owned: RefCell::new(Vec::new()), dry: true, mtp: false };
        b.stage(range)?;
        Ok(MapPlan::build(b.owned.into_inner(), file.alignment()))
    }

    /// The map plan of an MTP file's tensors, from the tensor directory alone (checks every name, shape
    /// and type against `cfg`, as `bind_mtp` does, and reads no tensor data).
    pub fn mtp_map_plan(file: &GgufFile, cfg: &Config) -> Result<MapPlan> {
        let b = Binder { f: file, cfg, owned: RefCell::new(Vec::new()), dry: true, mtp: true };
        b.mtp_parts()?;
        Ok(MapPlan::build(b.owned.into_inner(), file.alignment()))
    }

    fn bind_from(file: Arc<GgufFile>, path: Option<(&Path, &HostLoad)>, cfg: &Config, range: LayerRange) -> Result<Self> {
        check_range(&file, cfg, range)?;
        let b = Binder { f: &file, cfg, owned: RefCell::new(Vec::new()), dry: false, mtp: false };
        let (embed, layers, head) = b.stage(range)?;
        Self::finish(file.clone(), b, path, range, embed, layers, head, None)
    }

    #[allow(clippy::too_many_arguments)]
    fn finish(file: Arc<GgufFile>, b: Binder, path: Option<(&Path, &HostLoad)>, range: LayerRange, embed: Option<Mat>, layers: Vec<LayerWeights>, head: Option<HeadWeights>, mtp: Option<MtpHeadWeights>) -> Result<Self> {
        let plan = MapPlan::build(b.owned.into_inner(), file.alignment());
        let regions = match path {
            Some((p, load)) => load_spans(p, &plan, load)?,
            None => plan.spans.iter().map(|r| Region::Window(r.start as usize..r.end as usize)).collect(),
        };
        residency::count(residency::Op::Map, regions.len() as u64);
        let mut w = Self { file, range, embed, layers, head, mtp, plan, regions };
        w.locate_mats()?;
        Ok(w)
    }

    /// Binds an MTP file (`mtp.0.*` tensors) as the one-layer stage `cfg.n_layer - 1` of `cfg` (the main
    /// model's config with the MTP block appended, `mtp::block_config`), checking every tensor's shape
    /// and type against it. `path` brings the spans into memory as for the main model (None: in place).
    pub fn bind_mtp(file: Arc<GgufFile>, path: Option<(&Path, &HostLoad)>, cfg: &Config) -> Result<Self> {
        let il = cfg.n_layer - 1;
        let range = LayerRange { first: il, last: il, embed: false, head: false };
        let b = Binder { f: &file, cfg, owned: RefCell::new(Vec::new()), dry: false, mtp: true };
        let (layer, head) = b.mtp_parts()?;
        Self::finish(file.clone(), b, path, range, None, vec![layer], None, Some(head))
    }

    /// Points every matrix at its mapping (done once, at load).
    fn locate_mats(&mut self) -> Result<()> {
        let plan = &self.plan;
        let fix = |m: &mut Mat| -> Result<()> {
            let i = plan.find(m.start as u64, m.len as u64).ok_or_else(|| ModelError::Invalid("tensor outside the map plan".into()))?;
            m.map = i;
            m.off = m.start - plan.spans[i].start as usize;
            residency::count(residency::Op::Bind, 1);
            Ok(())
        };
        if let Some(e) = self.embed.as_mut() {
            fix(e)?;
        }
        for l in self.layers.iter_mut() {
            for m in [&mut l.hc_attn.fn_, &mut l.hc_ffn.fn_, &mut l.q_a, &mut l.q_b, &mut l.kv, &mut l.out_a, &mut l.out_b, &mut l.gate_inp, &mut l.gate_exps, &mut l.up_exps, &mut l.down_exps] {
                fix(m)?;
            }
            if let Some(c) = l.comp.as_mut() {
                fix(&mut c.kv)?;
                fix(&mut c.gate)?;
            }
            if let Some(i) = l.indexer.as_mut() {
                for m in [&mut i.q_b, &mut i.proj, &mut i.comp.kv, &mut i.comp.gate] {
                    fix(m)?;
                }
            }
            if let Some(sh) = l.shared.as_mut() {
                for m in sh.iter_mut() {
                    fix(m)?;
                }
            }
        }
        if let Some(h) = self.head.as_mut() {
            fix(&mut h.hc_fn)?;
            fix(&mut h.output)?;
        }
        if let Some(h) = self.mtp.as_mut() {
            fix(&mut h.e_proj)?;
            fix(&mut h.h_proj)?;
            fix(&mut h.hc_fn)?;
        }
        Ok(())
    }

    /// Embedding row of `token` as f32.
    pub fn embed_row(&self, token: u32, out: &mut [f32]) -> Result<()> {
        let m = self.embed.as_ref().ok_or_else(|| ModelError::Invalid("this stage has no embedding".into()))?;
        let t = token as usize;
        if t >= m.rows {
            return Err(ModelError::Invalid(format!("token id {t} is outside the vocabulary ({})", m.rows)));
        }
        let rb = m.ty.row_bytes(m.cols).unwrap_or(0);
        let s = m.off + t * rb;
        ds4_quant::dequantize(m.ty, &self.region(m.map)[s..s + rb], out)?;
        Ok(())
    }
}

struct Binder<'a> {
    f: &'a GgufFile,
    cfg: &'a Config,
    /// File byte ranges of every tensor the stage owns (input of the map plan).
    owned: RefCell<Vec<Range<u64>>>,
    /// Check the directory only: vectors and tables come back empty, no tensor data is read.
    dry: bool,
    /// Layer tensors are named `mtp.0.*` (the MTP file) instead of `blk.N.*`.
    mtp: bool,
}

/// A range must lie inside the model and, for a shard file, inside the shard.
fn check_range(file: &GgufFile, cfg: &Config, range: LayerRange) -> Result<()> {
    if range.first > range.last || range.last >= cfg.n_layer {
        return Err(ModelError::Invalid(format!(
            "layer range {}:{} is outside the model's {} layers",
            range.first, range.last, cfg.n_layer
        )));
    }
    check_shard(file, range)
}

/// A shard file records its layer range; a stage must lie inside it.
fn check_shard(f: &GgufFile, range: LayerRange) -> Result<()> {
    let Some(sr) = shard_range(f)? else { return Ok(()) };
    let inside = range.first >= sr.first && range.last <= sr.last && (!range.head || sr.head) && (!range.embed || sr.embed);
    if !inside {
        return Err(ModelError::Invalid(format!(
            "this file is a shard of layers {}; --layers {} is not contained in it",
            sr.label(),
            range.label()
        )));
    }
    Ok(())
}

/// The layer range recorded in a shard file's metadata (`ds4.shard.*`), if any.
pub fn shard_range(f: &GgufFile) -> Result<Option<LayerRange>> {
    if f.get("ds4.shard.first_layer").is_none() {
        return Ok(None);
    }
    let first = f.get_u32("ds4.shard.first_layer")? as usize;
    let last = f.get_u32("ds4.shard.last_layer")? as usize;
    let head = f.get_bool("ds4.shard.has_output")?;
    Ok(Some(LayerRange { first, last, embed: first == 0, head }))
}

const MATRIX_TYPES: &[GgmlType] =
    &[GgmlType::F32, GgmlType::F16, GgmlType::BF16, GgmlType::Q8_0, GgmlType::Q2_K, GgmlType::Q4_K, GgmlType::IQ2_XXS];
const VECTOR_TYPES: &[GgmlType] = &[GgmlType::F32, GgmlType::F16, GgmlType::BF16];

impl<'a> Binder<'a> {
    /// The MTP block (layer `cfg.n_layer - 1`, `mtp.0.*` names) and its input/head tensors.
    fn mtp_parts(&self) -> Result<(LayerWeights, MtpHeadWeights)> {
        let cfg = self.cfg;
        let layer = self.layer(cfg.n_layer - 1)?;
        if self.f.tensor(&format!("{MTP_PREFIX}exp_probs_b.bias")).is_none() {
            return Err(ModelError::Tensor { name: format!("{MTP_PREFIX}exp_probs_b.bias"), problem: "missing from the MTP file (the MTP block routes with a bias)".into() });
        }
        let e = cfg.n_embd;
        let head = MtpHeadWeights {
            e_proj: self.mat(&format!("{MTP_PREFIX}e_proj.weight"), e, e, 1)?,
            h_proj: self.mat(&format!("{MTP_PREFIX}h_proj.weight"), e, e, 1)?,
            enorm: self.vec(&format!("{MTP_PREFIX}enorm.weight"), e)?,
            hnorm: self.vec(&format!("{MTP_PREFIX}hnorm.weight"), e)?,
            norm: self.vec(&format!("{MTP_PREFIX}norm.weight"), e)?,
            hc_fn: self.mat(&format!("{MTP_PREFIX}hc_head_fn.weight"), cfg.n_hc, cfg.hc_dim(), 1)?,
            hc_scale: self.vec(&format!("{MTP_PREFIX}hc_head_scale.weight"), 1)?,
            hc_base: self.vec(&format!("{MTP_PREFIX}hc_head_base.weight"), cfg.n_hc)?,
        };
        Ok((layer, head))
    }

    /// The embedding, layers and head of `range`.
    fn stage(&self, range: LayerRange) -> Result<(Option<Mat>, Vec<LayerWeights>, Option<HeadWeights>)> {
        let cfg = self.cfg;
        let embed = if range.embed { Some(self.mat("token_embd.weight", cfg.n_vocab, cfg.n_embd, 1)?) } else { None };
        let layers = (range.first..=range.last).map(|il| self.layer(il)).collect::<Result<Vec<_>>>()?;
        let head = if range.head {
            Some(HeadWeights {
                hc_fn: self.mat("output_hc_fn.weight", cfg.n_hc, cfg.hc_dim(), 1)?,
                hc_scale: self.vec("output_hc_scale.weight", 1)?,
                hc_base: self.vec("output_hc_base.weight", cfg.n_hc)?,
                norm: self.vec("output_norm.weight", cfg.n_embd)?,
                output: self.mat("output.weight", cfg.n_vocab, cfg.n_embd, 1)?,
            })
        } else {
            None
        };
        Ok((embed, layers, head))
    }

    fn info(&self, name: &str) -> Result<&'a TensorInfo> {
        let t = self.f.tensor(name).ok_or_else(|| ModelError::Tensor { name: name.into(), problem: "missing from the model file".into() })?;
        self.owned.borrow_mut().push(self.f.tensor_file_range(t));
        Ok(t)
    }

    fn check_dims(&self, t: &TensorInfo, want: &[u64]) -> Result<()> {
        if t.dims != want {
            return Err(ModelError::Tensor {
                name: t.name.clone(),
                problem: format!("expected dims {:?}, found {:?}", want, t.dims),
            });
        }
        Ok(())
    }

    fn abs_range(&self, t: &TensorInfo) -> (usize, usize) {
        ((self.f.data_offset() + t.offset) as usize, t.n_bytes as usize)
    }

    /// `n_mat` stacked matrices of `rows`×`cols`; GGUF dims `[cols, rows(, n_mat)]`.
    fn mat(&self, name: &str, rows: usize, cols: usize, n_mat: usize) -> Result<Mat> {
        let t = self.info(name)?;
        let want: Vec<u64> = if n_mat == 1 { vec![cols as u64, rows as u64] } else { vec![cols as u64, rows as u64, n_mat as u64] };
        self.check_dims(t, &want)?;
        if !MATRIX_TYPES.contains(&t.ty) {
            return Err(ModelError::Tensor { name: name.into(), problem: format!("type {} is not a supported matrix type", t.ty.name()) });
        }
        let (start, len) = self.abs_range(t);
        Ok(Mat { ty: t.ty, rows, cols, n_mat, start, len, map: 0, off: 0 })
    }

    /// A small float vector (norms, biases, scales), converted to f32 at load. Accepts `[n]` or `[a, b]` with a·b = n.
    fn vec(&self, name: &str, n: usize) -> Result<Vec<f32>> {
        let t = self.info(name)?;
        if t.n_elems() != n as u64 {
            return Err(ModelError::Tensor { name: name.into(), problem: format!("expected {n} elements, found dims {:?}", t.dims) });
        }
        if !VECTOR_TYPES.contains(&t.ty) {
            return Err(ModelError::Tensor { name: name.into(), problem: format!("type {} is not a float type", t.ty.name()) });
        }
        if self.dry {
            return Ok(Vec::new());
        }
        let mut out = vec![0f32; n];
        ds4_quant::dequantize(t.ty, self.f.tensor_data(t), &mut out)?;
        Ok(out)
    }

    fn hc(&self, p: &str, kind: &str) -> Result<HcWeights> {
        let cfg = self.cfg;
        Ok(HcWeights {
            fn_: self.mat(&format!("{p}hc_{kind}_fn.weight"), cfg.hc_mix(), cfg.hc_dim(), 1)?,
            scale: self.vec(&format!("{p}hc_{kind}_scale.weight"), 3)?,
            base: self.vec(&format!("{p}hc_{kind}_base.weight"), cfg.hc_mix())?,
        })
    }

    fn compressor(&self, p: &str, prefix: &str, ratio: usize, coff: usize, d: usize) -> Result<CompressorWeights> {
        let cfg = self.cfg;
        let w = coff * d;
        Ok(CompressorWeights {
            ape: self.vec(&format!("{p}{prefix}_ape.weight"), w * ratio)?,
            kv: self.mat(&format!("{p}{prefix}_kv.weight"), w, cfg.n_embd, 1)?,
            gate: self.mat(&format!("{p}{prefix}_gate.weight"), w, cfg.n_embd, 1)?,
            norm: self.vec(&format!("{p}{prefix}_norm.weight"), d)?,
        })
    }

    fn layer(&self, il: usize) -> Result<LayerWeights> {
        let cfg = self.cfg;
        let p = if self.mtp { MTP_PREFIX.to_string() } else { format!("blk.{il}.") };
        let n = |s: &str| format!("{p}{s}");
        let ratio = cfg.ratio(il);
        let coff = cfg.compress_coff(il);
        let comp = if ratio != 0 { Some(self.compressor(&p, "attn_compressor", ratio, coff, cfg.head_dim)?) } else { None };
        let indexer = if ratio == 4 {
            Some(IndexerWeights {
                q_b: self.mat(&n("indexer.attn_q_b.weight"), cfg.idx_heads * cfg.idx_dim, cfg.q_lora, 1)?,
                proj: self.mat(&n("indexer.proj.weight"), cfg.idx_heads, cfg.n_embd, 1)?,
                comp: self.compressor(&p, "indexer_compressor", ratio, coff, cfg.idx_dim)?,
            })
        } else {
            None
        };
        let tid2eid = if cfg.is_hash_layer(il) { Some(self.tid2eid(&n("ffn_gate_tid2eid.weight"))?) } else { None };
        let exp_bias = if cfg.is_hash_layer(il) {
            None
        } else if self.f.tensor(&n("exp_probs_b.bias")).is_some() {
            Some(self.vec(&n("exp_probs_b.bias"), cfg.n_expert)?)
        } else {
            None
        };
        let shared = if cfg.n_shared > 0 {
            Some([
                self.mat(&n("ffn_gate_shexp.weight"), cfg.ff_exp, cfg.n_embd, 1)?,
                self.mat(&n("ffn_up_shexp.weight"), cfg.ff_exp, cfg.n_embd, 1)?,
                self.mat(&n("ffn_down_shexp.weight"), cfg.n_embd, cfg.ff_exp, 1)?,
            ])
        } else {
            None
        };
        let gate_exps = self.mat(&n("ffn_gate_exps.weight"), cfg.ff_exp, cfg.n_embd, cfg.n_expert)?;
        let up_exps = self.mat(&n("ffn_up_exps.weight"), cfg.ff_exp, cfg.n_embd, cfg.n_expert)?;
        let down_exps = self.mat(&n("ffn_down_exps.weight"), cfg.n_embd, cfg.ff_exp, cfg.n_expert)?;
        Ok(LayerWeights {
            il,
            hc_attn: self.hc(&p, "attn")?,
            attn_norm: self.vec(&n("attn_norm.weight"), cfg.n_embd)?,
            q_a: self.mat(&n("attn_q_a.weight"), cfg.q_lora, cfg.n_embd, 1)?,
            q_a_norm: self.vec(&n("attn_q_a_norm.weight"), cfg.q_lora)?,
            q_b: self.mat(&n("attn_q_b.weight"), cfg.q_dim(), cfg.q_lora, 1)?,
            kv: self.mat(&n("attn_kv.weight"), cfg.head_dim, cfg.n_embd, 1)?,
            kv_norm: self.vec(&n("attn_kv_a_norm.weight"), cfg.head_dim)?,
            sinks: self.vec(&n("attn_sinks.weight"), cfg.n_head)?,
            out_a: self.mat(&n("attn_output_a.weight"), cfg.o_groups * cfg.o_lora, cfg.heads_per_group() * cfg.head_dim, 1)?,
            out_b: self.mat(&n("attn_output_b.weight"), cfg.n_embd, cfg.o_groups * cfg.o_lora, 1)?,
            comp,
            indexer,
            hc_ffn: self.hc(&p, "ffn")?,
            ffn_norm: self.vec(&n("ffn_norm.weight"), cfg.n_embd)?,
            gate_inp: self.mat(&n("ffn_gate_inp.weight"), cfg.n_expert, cfg.n_embd, 1)?,
            exp_bias,
            tid2eid,
            gate_exps,
            up_exps,
            down_exps,
            shared,
        })
    }

    fn tid2eid(&self, name: &str) -> Result<Vec<u32>> {
        let cfg = self.cfg;
        let t = self.info(name)?;
        self.check_dims(t, &[cfg.n_expert_used as u64, cfg.n_vocab as u64])?;
        if t.ty != GgmlType::I32 {
            return Err(ModelError::Tensor { name: name.into(), problem: format!("expected I32, found {}", t.ty.name()) });
        }
        if self.dry {
            return Ok(Vec::new());
        }
        let data = self.f.tensor_data(t);
        let mut out = Vec::with_capacity(cfg.n_expert_used * cfg.n_vocab);
        for c in data.chunks_exact(4) {
            let v = i32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            if v < 0 || v as usize >= cfg.n_expert {
                return Err(ModelError::Tensor { name: name.into(), problem: format!("expert id {v} outside 0..{}", cfg.n_expert) });
            }
            out.push(v as u32);
        }
        Ok(out)
    }
}
