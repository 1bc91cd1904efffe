//! Attention core of one layer for the step's tokens (`ds4_model::stage::Stage::attention_block`
//! from the raw-row gather to the per-head inverse RoPE): queries over the sliding-window ring plus
//! this step's new KV rows (causal) and the compressed rows (all, or the indexer's picks), with the
//! per-head sink; then the inverse rotation of the output, and the new rows stored into the ring.
//! A workgroup serves 4 heads (the rows are shared: MQA); steps with few tokens (decode) split the
//! candidates across workgroups and merge the splits' partial softmax sums. The ring and the
//! compressed rows hold one part per KV slot; a batched step (one sequence per row) reads each row's
//! own slot and splits as a one-token step does, so each row sums as it does decoded alone; so does a
//! short step of up to `SHORT_STEP` tokens (an MTP verify), whose rows then equal decode steps bit for bit.
use std::sync::Arc;

use super::{check_tokens, grid, u32_of, Rope};
use crate::buffer::GpuBuffer;
use crate::encoder::Encoder;
use crate::error::WgpuError;
use crate::gpu::Gpu;
use crate::shaders::{attention_source, Reduce, ATTENTION_MERGE, ATTENTION_TILES, RING_STORE};

/// The widest head the kernel holds in workgroup memory.
pub const ATTENTION_MAX_HEAD_DIM: usize = 512;
/// Heads per workgroup in the steps that split (they share each candidate row read: MQA). The split
/// count depends on it, so it is fixed: every adapter splits a decode row the same way.
const HEADS_PER_GROUP: usize = crate::shaders::ATTENTION_HEADS as usize;
/// Candidates per tile in the steps that split (decode, short and batched steps: shorter serial work per
/// workgroup, more workgroups) and in the steps that do not (prefill: fewer barriers).
const SPLIT_TILE: usize = ATTENTION_TILES[0] as usize;
const LONG_TILE: usize = ATTENTION_TILES[1] as usize;
/// Workgroups a step aims for: a step with fewer (token, head group) pairs splits the candidates.
const SPLIT_TARGET: usize = 1024;
const MAX_SPLIT: usize = 64; // attention_merge.wgsl holds this many split factors (MAX_SPLITS)

#[derive(Debug, Clone, Copy)]
pub struct AttentionShape {
    pub n_head: usize,
    pub head_dim: usize,
    pub swa: usize,
    /// 0: window only; 4 or 128: compressed rows (ratio 4 layers have an indexer).
    pub ratio: usize,
    /// Indexer picks per token (`idx_topk`) when the layer has an indexer, else 0.
    pub top_k: usize,
    /// Rows of the compressed-row buffer.
    pub capacity: usize,
    pub max_tokens: u32,
}

/// The buffers of one layer's attention.
pub struct AttentionBuffers<'a> {
    /// max_tokens x n_head x head_dim: normed, roped queries.
    pub q: &'a GpuBuffer,
    /// max_tokens x head_dim: this step's finished KV rows.
    pub kv: &'a GpuBuffer,
    /// swa x head_dim: position q at row q % swa (read, then this step's rows are stored).
    pub ring: &'a GpuBuffer,
    /// capacity x head_dim finished compressed rows (ratio > 0).
    pub comp: Option<&'a GpuBuffer>,
    /// max_tokens x top_k row ids as u32 (an indexer's output; read only where a token sees more
    /// than top_k compressed rows).
    pub sel: Option<&'a GpuBuffer>,
    /// n_head sink logits.
    pub sinks: &'a GpuBuffer,
    /// max_tokens x n_head x head_dim output.
    pub o: &'a GpuBuffer,
}

pub struct Attention {
    /// How tile scores are summed: a subgroup per candidate, or a thread per candidate.
    pub reduce: Reduce,
    /// The kernel for steps that split (`SPLIT_TILE`) and for the others (`LONG_TILE`), with their bindings.
    split: (Arc<wgpu::ComputePipeline>, wgpu::BindGroup),
    long: (Arc<wgpu::ComputePipeline>, wgpu::BindGroup),
    merge: Arc<wgpu::ComputePipeline>,
    merge_bind: wgpu::BindGroup,
    groups: usize,
    max_split: usize,
    /// The split partials' buffer (owned, or the stage's shared one) and its floats.
    _part: Option<GpuBuffer>,
    part_len: usize,
    store: Arc<wgpu::ComputePipeline>,
    store_bind: wgpu::BindGroup,
    store_wg_x: u32,
    unrope: Rope,
    shape: AttentionShape,
    _dummies: Vec<GpuBuffer>,
}

impl Attention {
    /// `freqs`: the layer's rotation (`ds4_model::rope::Rope::freqs`), undone on the output.
    pub fn new(gpu: &Gpu, b: &AttentionBuffers, shape: AttentionShape, freqs: &[f64]) -> Result<Self, WgpuError> {
        Self::with_splits(gpu, b, shape, freqs, None)
    }

    /// As `new`, with the split partials in `part` (one buffer the layers of a stage share: they run
    /// one after another), sized by [`split_floats`] for the batches the stage takes.
    pub fn with_splits(gpu: &Gpu, b: &AttentionBuffers, shape: AttentionShape, freqs: &[f64], part: Option<&GpuBuffer>) -> Result<Self, WgpuError> {
        let AttentionShape { n_head, head_dim: d, swa, ratio, top_k, capacity, max_tokens } = shape;
        let bad = |reason: String| WgpuError::BadShape { what: "attention".into(), reason };
        let m = max_tokens.max(1) as usize;
        if d == 0 || d > ATTENTION_MAX_HEAD_DIM || !d.is_multiple_of(4) || n_head == 0 || swa == 0 {
            return Err(bad(format!("{n_head} heads of {d} (a multiple of 4, at most {ATTENTION_MAX_HEAD_DIM}), window {swa}")));
        }
        if b.q.len() < m * n_head * d || b.o.len() < m * n_head * d || b.kv.len() < m * d || b.ring.len() < swa * d || b.sinks.len() < n_head {
            return Err(bad("a buffer is smaller than the shape".into()));
        }
        if ratio != 0 && b.comp.is_none_or(|c| c.len() < capacity * d) {
            return Err(bad(format!("ratio {ratio} needs a compressed-row buffer of {capacity} rows")));
        }
        if top_k != 0 && (ratio == 0 || b.sel.is_none_or(|s| s.len() < m * top_k)) {
            return Err(bad(format!("top-k {top_k} needs compressed rows and a selection buffer of {m} x {top_k}")));
        }
        // Row ids (of every slot) carry a 2-bit source tag.
        if b.comp.map_or(0, |c| c.len() / d) >= 1 << 30 || b.ring.len() / d >= 1 << 30 {
            return Err(bad("row ids must stay below 2^30".into()));
        }
        let reduce = if gpu.caps().subgroup { Reduce::Subgroup } else { Reduce::Tree };
        let mut dummies = Vec::new();
        if b.comp.is_none() {
            dummies.push(GpuBuffer::new(gpu, "attention no compressed rows", 4)?);
        }
        if b.sel.is_none() {
            dummies.push(GpuBuffer::new(gpu, "attention no selection", 1)?);
        }
        let mut di = dummies.iter();
        let comp = match b.comp {
            Some(c) => &c.buffer,
            None => &di.next().ok_or_else(|| bad("dummy".into()))?.buffer,
        };
        let sel = match b.sel {
            Some(s) => &s.buffer,
            None => &di.next().ok_or_else(|| bad("dummy".into()))?.buffer,
        };
        let scale = 1.0 / (d as f32).sqrt();
        let groups = n_head.div_ceil(HEADS_PER_GROUP);
        // No more splits than tiles of the largest candidate set.
        let max_cand = max_candidates(swa, ratio, top_k, capacity);
        let max_split = max_cand.div_ceil(SPLIT_TILE).clamp(1, MAX_SPLIT);
        // Split partials (acc, max, sum) of the steps that split (short and batched ones).
        let own = match part {
            Some(_) => None,
            None => Some(GpuBuffer::new(gpu, "attention splits", split_floats(n_head, d, max_cand, m, 1).max(1))?),
        };
        let part = part.or(own.as_ref()).ok_or_else(|| bad("no split buffer".into()))?;
        let params: [u32; 12] = [
            u32_of("heads", n_head)?,
            u32_of("head dim", d)?,
            u32_of("window", swa)?,
            u32_of("ratio", ratio)?,
            u32_of("top k", top_k)?,
            scale.to_bits(),
            u32_of("head groups", groups)?,
            nsplit_of(1, groups, max_split) as u32,
            SHORT_STEP as u32,
            u32_of("capacity", capacity)?,
            0,
            0,
        ];
        let uni = gpu.uniform("attention", bytemuck::cast_slice(&params))?;
        let kernel = |tile: usize, heads: u32| -> Result<_, WgpuError> {
            let pipeline = gpu.pipeline(&format!("attention_{reduce:?}_t{tile}_h{heads}"), || Ok(attention_source(reduce, tile as u32, heads)))?;
            let bind = gpu.bind_group("attention", &pipeline, &[&b.q.buffer, &b.kv.buffer, &b.ring.buffer, comp, sel, &b.sinks.buffer, &b.o.buffer, &part.buffer, &uni, &gpu.step])?;
            Ok((pipeline, bind))
        };
        let (split, long) = (kernel(SPLIT_TILE, HEADS_PER_GROUP as u32)?, kernel(LONG_TILE, HEADS_PER_GROUP as u32)?);
        let merge = gpu.pipeline("attention_merge", || Ok(ATTENTION_MERGE.to_string()))?;
        let merge_bind = gpu.bind_group("attention merge", &merge, &[&part.buffer, &b.o.buffer, &uni, &gpu.step])?;

        let store = gpu.pipeline("ring_store", || Ok(RING_STORE.to_string()))?;
        let store_wg_x = grid(u32_of("ring rows", m.min(swa) * d)?.div_ceil(64)).0;
        let sp: [u32; 4] = [u32_of("head dim", d)?, u32_of("window", swa)?, store_wg_x, 0];
        let suni = gpu.uniform("ring store", bytemuck::cast_slice(&sp))?;
        let store_bind = gpu.bind_group("ring store", &store, &[&b.kv.buffer, &b.ring.buffer, &suni, &gpu.step])?;
        let unrope = Rope::new(gpu, b.o, n_head, d, freqs, true, max_tokens)?;
        let part_len = part.len();
        Ok(Self { reduce, split, long, merge, merge_bind, groups, max_split, _part: own, part_len, store, store_bind, store_wg_x, unrope, shape, _dummies: dummies })
    }

    /// How many workgroups share a token's candidates in a step of `ntok` tokens (1: no merge).
    pub fn splits(&self, ntok: u32) -> u32 {
        nsplit_of(ntok as usize, self.groups, self.max_split) as u32
    }

    /// Attention, the inverse rotation of `o`, then the ring store (after every read of the ring).
    pub fn encode(&self, enc: &mut Encoder) -> Result<(), WgpuError> {
        let st = enc.step();
        check_tokens("attention", st.ntok, self.shape.max_tokens)?;
        if st.ntok == 0 {
            return Ok(());
        }
        let end = enc.end().ok_or_else(|| WgpuError::BadShape { what: "attention".into(), reason: "position overflow".into() })? as usize;
        if self.shape.ratio != 0 && end / self.shape.ratio > self.shape.capacity {
            return Err(WgpuError::BadShape { what: "attention".into(), reason: format!("{} compressed rows, capacity {}", end / self.shape.ratio, self.shape.capacity) });
        }
        // A batched step splits each row as a one-token step (attention.wgsl does the same).
        let batched = enc.batched();
        let short = batched || st.ntok as usize <= SHORT_STEP;
        let nsplit = if short { self.splits(1) } else { 1 };
        let need = if nsplit > 1 { (st.ntok * nsplit) as usize * self.shape.n_head * (self.shape.head_dim + 2) } else { 0 };
        if need > self.part_len {
            return Err(WgpuError::BadShape { what: "attention".into(), reason: format!("{} rows need {need} floats of split partials, {} held", st.ntok, self.part_len) });
        }
        {
            let pass = enc.pass();
            let (pipeline, bind) = if short { &self.split } else { &self.long };
            pass.set_pipeline(pipeline);
            pass.set_bind_group(0, bind, &[]);
            pass.dispatch_workgroups(self.groups as u32, st.ntok, nsplit);
            if nsplit > 1 {
                pass.set_pipeline(&self.merge);
                pass.set_bind_group(0, &self.merge_bind, &[]);
                pass.dispatch_workgroups(self.shape.n_head as u32, st.ntok, 1);
            }
        }
        self.unrope.encode(enc)?;
        let n = if batched { st.ntok } else { st.ntok.min(self.shape.swa as u32) } * self.shape.head_dim as u32;
        let pass = enc.pass();
        pass.set_pipeline(&self.store);
        pass.set_bind_group(0, &self.store_bind, &[]);
        pass.dispatch_workgroups(self.store_wg_x.min(n.div_ceil(64)), n.div_ceil(64).div_ceil(self.store_wg_x), 1);
        Ok(())
    }
}

/// The most candidate rows a token attends to: its window, then the compressed rows (all of them, or
/// the indexer's top-k).
pub fn max_candidates(swa: usize, ratio: usize, top_k: usize, capacity: usize) -> usize {
    swa + if ratio == 0 { 0 } else if top_k != 0 { top_k } else { capacity }
}

/// Floats of the split partials for steps of up to `max_tokens` tokens and batched steps of up to
/// `batch_rows` rows (each split as one token), for `n_head` heads of `d` over at most `max_cand`
/// candidates per token.
pub fn split_floats(n_head: usize, d: usize, max_cand: usize, max_tokens: usize, batch_rows: usize) -> usize {
    let groups = n_head.div_ceil(HEADS_PER_GROUP);
    let max_split = max_cand.div_ceil(SPLIT_TILE).clamp(1, MAX_SPLIT);
    let split = nsplit_of(1, groups, max_split);
    if split == 1 {
        return 0;
    }
    // Only short steps (each token split as one) and batched steps split.
    max_tokens.clamp(1, SHORT_STEP).max(batch_rows) * split * n_head * (d + 2)
}

/// Steps of up to this many tokens (an MTP verify of 1 + k tokens, a rollback's re-run) split each token
/// as a one-token step does, so each sums as it does decoded alone (the kernels get it in their uniform).
pub const SHORT_STEP: usize = 8;

/// Candidate splits of a step of `ntok` tokens (the kernels take the one-token count from the uniform): a short step splits
/// each token as a one-token step does, a longer one not at all.
fn nsplit_of(ntok: usize, groups: usize, max_split: usize) -> usize {
    if ntok > SHORT_STEP {
        return 1;
    }
    (SPLIT_TARGET / groups.max(1)).clamp(1, max_split)
}
