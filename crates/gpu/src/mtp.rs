//! The MTP drafter on a GPU, written once for every backend: the MTP block (the one window-only layer
//! of `ds4_model::mtp::block_config`) runs as a one-layer [`GpuStage`] whose "embedding" is the
//! block's input and whose head is the MTP head, so the stage's checks, position bookkeeping, decode
//! replay and KV journal serve the drafter unchanged.
//!
//! For pairs (hidden row H, token t): `X_s = e_proj · rmsw(embed(t), enorm) + h_proj · rmsw(H_s, hnorm)`;
//! the block turns X into X'; the head collapses X' with the MTP's `hc_head_*`, norms with its `norm`
//! and projects with the main model's `output` (logits of the token after t). The embedding rows of a
//! step (a few tokens) are gathered on the host from the main model's weights and uploaded with the
//! hidden rows; everything else runs on the device. A recursive draft takes the block's own output row,
//! copied on the device.
//!
//! A backend provides [`MtpOps`]: its ops for the block (built like a one-layer stage, with the MTP
//! head installed as the stage's head) plus the pair upload and the input ops; [`MtpDevice`] turns
//! them into the block's `DeviceOps`, [`GpuMtp`] is the drafter.
use crate::error::{GpuError, Result};
use crate::ops::{Compressor, DeviceOps, Lane, LayerInfo, Step, Sub};
use crate::stage::GpuStage;
use ds4_model::{Config, KvState, LayerRange, Logits, Weights};

/// Where the hidden rows of a step's pairs come from.
#[derive(Debug, Clone, Copy)]
pub enum PairHidden<'a> {
    /// From the host: one HC row (n_hc × n_embd) per pair.
    Host(&'a [f32]),
    /// The block's own output: HC row `row` of the previous step's streams (a recursive draft: one
    /// pair), copied on the device.
    Own { row: usize },
}

/// What a backend adds to the block's ops to make them the drafter.
pub trait MtpOps {
    /// The block's ops: a one-layer stage of the MTP weights with the MTP head as its head
    /// (`has_head` true, `head_norm` / `logits` / `argmax` being the MTP head's collapse, norm, output
    /// product and pick).
    type Block: DeviceOps;
    fn block(&self) -> &Self::Block;
    fn block_mut(&mut self) -> &mut Self::Block;

    /// Sets the pairs of the next step: `emb` holds one embedding row (n_embd, before `enorm`) per
    /// pair, `hidden` their hidden rows. Issued before the step, in order with it.
    fn load_pairs(&mut self, emb: &[f32], hidden: PairHidden<'_>) -> Result<()>;

    /// Records the block's input streams of the step from the loaded pairs (in place of an
    /// embedding): X_s = e_proj · rmsw(emb, enorm) + h_proj · rmsw(H_s, hnorm).
    fn inputs(&mut self, step: Step) -> Result<()>;

    /// The KV checkpoint of the recursive drafts (the block's, where it has one).
    fn can_checkpoint(&self) -> bool { self.block().can_checkpoint() }
    fn checkpoint(&mut self, restore: bool) -> Result<()> { self.block_mut().checkpoint(restore) }
}

/// The block's `DeviceOps`: the backend's block ops with the pair inputs in place of the embedding.
pub struct MtpDevice<M: MtpOps> {
    pub ops: M,
    /// The main model's vocabulary (token ids are checked against it).
    vocab: usize,
}

impl<M: MtpOps> DeviceOps for MtpDevice<M> {
    fn bind(&mut self) -> Result<()> { self.ops.block_mut().bind() }
    fn layer(&self, li: usize) -> LayerInfo { self.ops.block().layer(li) }
    /// The pair inputs stand for the embedding: the stage then runs `embed` for token input.
    fn has_embed(&self) -> bool { true }
    fn has_head(&self) -> bool { self.ops.block().has_head() }
    fn embed_rows(&self) -> usize { self.vocab }
    fn hash_routed(&self) -> bool { self.ops.block().hash_routed() }
    fn begin_step(&mut self, step: Step, tokens: &[u32]) -> Result<()> { self.ops.block_mut().begin_step(step, tokens) }
    fn load_hidden(&mut self, _h: &[f32]) -> Result<()> { Err(GpuError::Device("the MTP drafter takes (hidden row, token) pairs, not hidden input".into())) }
    fn embed(&mut self, step: Step) -> Result<()> { self.ops.inputs(step) }
    fn fork(&mut self, lane: Lane) -> Result<()> { self.ops.block_mut().fork(lane) }
    fn to_main(&mut self) { self.ops.block_mut().to_main() }
    fn join(&mut self, lane: Lane) -> Result<()> { self.ops.block_mut().join(lane) }
    fn hc_entry(&mut self, li: usize, sub: Sub, step: Step) -> Result<()> { self.ops.block_mut().hc_entry(li, sub, step) }
    fn kv_row(&mut self, li: usize, step: Step) -> Result<()> { self.ops.block_mut().kv_row(li, step) }
    fn compress(&mut self, li: usize, which: Compressor, step: Step) -> Result<()> { self.ops.block_mut().compress(li, which, step) }
    fn indexer_weights(&mut self, li: usize, step: Step) -> Result<()> { self.ops.block_mut().indexer_weights(li, step) }
    fn q_lora(&mut self, li: usize, step: Step) -> Result<()> { self.ops.block_mut().q_lora(li, step) }
    fn indexer_query(&mut self, li: usize, step: Step) -> Result<()> { self.ops.block_mut().indexer_query(li, step) }
    fn q_heads(&mut self, li: usize, step: Step) -> Result<()> { self.ops.block_mut().q_heads(li, step) }
    fn indexer_select(&mut self, li: usize, step: Step) -> Result<()> { self.ops.block_mut().indexer_select(li, step) }
    fn attend(&mut self, li: usize, step: Step, selected: bool) -> Result<()> { self.ops.block_mut().attend(li, step, selected) }
    fn attn_out(&mut self, li: usize, step: Step) -> Result<()> { self.ops.block_mut().attn_out(li, step) }
    fn shared_expert(&mut self, li: usize, step: Step) -> Result<()> { self.ops.block_mut().shared_expert(li, step) }
    fn route(&mut self, li: usize, step: Step) -> Result<()> { self.ops.block_mut().route(li, step) }
    fn experts(&mut self, li: usize, step: Step) -> Result<()> { self.ops.block_mut().experts(li, step) }
    fn ffn_exit(&mut self, li: usize, step: Step) -> Result<()> { self.ops.block_mut().ffn_exit(li, step) }
    fn flush(&mut self) -> Result<()> { self.ops.block_mut().flush() }
    fn head_norm(&mut self, r0: usize, m: usize) -> Result<()> { self.ops.block_mut().head_norm(r0, m) }
    fn logits(&mut self, m: usize) -> Result<()> { self.ops.block_mut().logits(m) }
    fn argmax(&mut self) -> Result<()> { self.ops.block_mut().argmax() }
    fn sync(&mut self) -> Result<()> { self.ops.block_mut().sync() }
    fn read_logits(&mut self, dst: &mut [f32]) -> Result<()> { self.ops.block_mut().read_logits(dst) }
    fn read_hidden(&mut self, dst: &mut [f32]) -> Result<()> { self.ops.block_mut().read_hidden(dst) }
    fn read_top1(&mut self) -> Result<(u32, f32)> { self.ops.block_mut().read_top1() }
    fn reset_state(&mut self) -> Result<()> { self.ops.block_mut().reset_state() }
    fn snapshot(&mut self, restore: bool) -> Result<()> { self.ops.block_mut().snapshot(restore) }
    fn download_kv(&mut self, kv: &mut KvState) -> Result<()> { self.ops.block_mut().download_kv(kv) }
    fn upload_kv(&mut self, kv: &KvState) -> Result<()> { self.ops.block_mut().upload_kv(kv) }
    fn slots(&self) -> usize { self.ops.block().slots() }
    fn select_slot(&mut self, slot: usize) -> Result<()> { self.ops.block_mut().select_slot(slot) }
    fn begin_batch(&mut self, _step: Step, _rows: &[(usize, usize)], _tokens: &[u32]) -> Result<()> {
        Err(GpuError::Device("the MTP drafter runs one sequence".into()))
    }
    fn can_checkpoint(&self) -> bool { self.ops.can_checkpoint() }
    fn checkpoint(&mut self, restore: bool) -> Result<()> { self.ops.checkpoint(restore) }
    fn can_replay(&self) -> bool { self.ops.block().can_replay() }
    fn has_replay(&self, key: usize, pos: usize) -> bool { self.ops.block().has_replay(key, pos) }
    fn begin_record(&mut self, step: Step) -> Result<()> { self.ops.block_mut().begin_record(step) }
    fn end_record(&mut self, key: usize, ok: bool) -> Result<()> { self.ops.block_mut().end_record(key, ok) }
    fn replay(&mut self, key: usize) -> Result<()> { self.ops.block_mut().replay(key) }
    fn replay_consumes(&self) -> bool { self.ops.block().replay_consumes() }
    fn note_call(&mut self, one_token: bool) { self.ops.block_mut().note_call(one_token) }
}

/// The MTP drafter on a device: [`ds4_model::mtp::Mtp`]'s contract (pairs at consecutive positions of
/// the drafter's own window cache, logits of the last pair's next token), with the cache on the device
/// (`kv` carries its position) and an undo journal for recursive drafts.
pub struct GpuMtp<M: MtpOps> {
    stage: GpuStage<MtpDevice<M>>,
    /// Pairs a step holds at most (longer runs go in steps of this many).
    nmax: usize,
    /// The step's embedding rows, gathered on the host (reused).
    rows: Vec<f32>,
    /// Rows of the last step (a recursive draft continues from its last); 0: none to continue from.
    last_rows: usize,
    /// Position of the journal's start while recursive drafts are journaled.
    journal: Option<usize>,
}

impl<M: MtpOps> GpuMtp<M> {
    /// The drafter over `ops`, the block of `cfg` (`mtp::block_config` of the main model: the block is
    /// its last layer), with steps of up to `nmax` pairs and a cache for `ctx` positions.
    pub fn new(cfg: Config, ops: M, nmax: usize, ctx: usize) -> Result<Self> {
        let il = cfg.n_layer.checked_sub(1).ok_or(GpuError::Device("the MTP block config has no layer".into()))?;
        let range = LayerRange { first: il, last: il, embed: false, head: false };
        let vocab = cfg.n_vocab;
        let nmax = nmax.max(1);
        let stage = GpuStage::new(cfg, MtpDevice { ops, vocab }, range, nmax, ctx)?;
        if !stage.ops.has_head() {
            return Err(GpuError::NoHead);
        }
        Ok(Self { stage, nmax, rows: Vec::new(), last_rows: 0, journal: None })
    }

    pub fn cfg(&self) -> &Config { &self.stage.cfg }

    /// The backend's drafter ops (counters, tests).
    pub fn ops(&self) -> &M { &self.stage.ops.ops }
    pub fn ops_mut(&mut self) -> &mut M { &mut self.stage.ops.ops }

    /// Whether recursive drafts can be undone (`begin_journal` / `rollback`).
    pub fn can_journal(&self) -> bool { self.stage.can_journal() }

    /// Embedding rows of `tokens` from the main model's table into `self.rows`.
    fn gather(&mut self, main: &Weights, tokens: &[u32]) -> Result<()> {
        let e = self.stage.cfg.n_embd;
        self.rows.resize(tokens.len() * e, 0.0);
        for (r, &t) in self.rows.chunks_exact_mut(e).zip(tokens) {
            main.embed_row(t, r).map_err(|err| GpuError::Device(format!("MTP draft embedding: {err}")))?;
        }
        Ok(())
    }

    /// Runs the block over `tokens.len()` pairs at `kv.pos..`: `hidden` holds one HC row per pair,
    /// `tokens[i]` the token after hidden row i; `main` is the main model's weights (its embedding).
    /// Returns the logits of the last pair's next token, or nothing when `logits` is false.
    ///
    /// More pairs than the window: the block is window-only and a pair's KV row depends on that pair
    /// alone, so only the last `swa` rows can ever be read again; the cache then starts over with those
    /// pairs (attention depends on position differences only, so what later drafts see is the same up
    /// to rounding). Outside a journal only.
    pub fn forward(&mut self, main: &Weights, kv: &mut KvState, hidden: &[f32], tokens: &[u32], logits: bool) -> Result<&[f32]> {
        let hd = self.stage.cfg.hc_dim();
        let n = tokens.len();
        if hidden.len() != n * hd {
            return Err(GpuError::HiddenSize { got: hidden.len(), want: n * hd });
        }
        if n == 0 {
            return if logits { Err(GpuError::Device("MTP logits asked for no pair".into())) } else { Ok(&[]) };
        }
        let swa = self.stage.cfg.swa.max(1);
        let (hidden, tokens) = if n > swa && self.journal.is_none() {
            kv.pos = 0;
            (&hidden[(n - swa) * hd..], &tokens[n - swa..])
        } else {
            (hidden, tokens)
        };
        let n = tokens.len();
        let mut done = 0;
        while n - done > self.nmax {
            let t = &tokens[done..done + self.nmax];
            self.step(main, kv, t, PairHidden::Host(&hidden[done * hd..(done + self.nmax) * hd]), Logits::None)?;
            done += self.nmax;
        }
        let want = if logits { Logits::Last } else { Logits::None };
        self.step(main, kv, &tokens[done..], PairHidden::Host(&hidden[done * hd..]), want)
    }

    /// A recursive draft: the pair (the block's own output row of the last pair of the previous call,
    /// `token`) at `kv.pos`; returns the logits of the token after `token`.
    pub fn forward_own(&mut self, main: &Weights, kv: &mut KvState, token: u32) -> Result<&[f32]> {
        let row = self.own_row()?;
        self.step(main, kv, std::slice::from_ref(&token), PairHidden::Own { row }, Logits::Last)
    }

    /// `forward_own` with only the greedy pick coming back (index, log-probability), taken on the device.
    pub fn forward_own_top1(&mut self, main: &Weights, kv: &mut KvState, token: u32) -> Result<(u32, f32)> {
        let row = self.own_row()?;
        let t = std::slice::from_ref(&token);
        self.gather(main, t)?;
        self.stage.ops.ops.load_pairs(&self.rows, PairHidden::Own { row })?;
        self.last_rows = 0;
        let r = self.stage.forward_argmax(kv, t, None)?;
        self.last_rows = 1;
        Ok(r)
    }

    fn own_row(&self) -> Result<usize> {
        self.last_rows.checked_sub(1).ok_or(GpuError::Device("a recursive MTP draft needs a previous draft step to continue from".into()))
    }

    /// One step of at most `nmax` pairs.
    fn step(&mut self, main: &Weights, kv: &mut KvState, tokens: &[u32], hidden: PairHidden<'_>, want: Logits) -> Result<&[f32]> {
        self.gather(main, tokens)?;
        self.stage.ops.ops.load_pairs(&self.rows, hidden)?;
        self.last_rows = tokens.len();
        match self.stage.forward(kv, tokens, None, want) {
            Ok(l) => Ok(l),
            Err(e) => {
                // A failed step leaves no output row to continue from.
                self.last_rows = 0;
                Err(e)
            }
        }
    }

    /// Starts undoable recursive drafts at `kv.pos` (the device checkpoints the cache).
    pub fn begin_journal(&mut self, kv: &KvState) -> Result<()> {
        self.stage.begin_journal(kv)?;
        self.journal = Some(kv.pos);
        Ok(())
    }

    /// Returns the cache and `kv.pos` to the journal's start (the journal stays open).
    pub fn rollback(&mut self, kv: &mut KvState) -> Result<()> {
        let from = self.journal.ok_or(GpuError::Journal("MTP rollback without a journal"))?;
        self.stage.rollback(kv, from)?;
        // The streams hold a rolled-back draft's output.
        self.last_rows = 0;
        Ok(())
    }

    pub fn end_journal(&mut self) {
        self.stage.end_journal();
        self.journal = None;
    }
}
