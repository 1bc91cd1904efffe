//! The device-op trait: what a GPU backend implements so that [`crate::GpuStage`] can run the forward
//! pass on it. The stage owns the order of the ops (the model, written once); a backend owns its weights,
//! KV state and work buffers, and may fuse ops behind these calls (e.g. leave a sub-layer exit to the
//! next entry) as long as the results are the same.
use crate::error::Result;
use ds4_model::KvState;

/// One forward step: `n` tokens starting at position `pos0`. `decode` is a one-token step that may be
/// recorded once and replayed at every position: the backend then reads the position from the device
/// (set by `begin_step`), and a recorded step carries `pos0` 0. `batch`: the `n` rows are independent
/// sequences, one token each, in the slots and at the positions `begin_batch` gave (`pos0` is then
/// the largest of those positions).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Step {
    pub n: usize,
    pub pos0: usize,
    pub decode: bool,
    pub batch: bool,
}

/// Which sub-layer of a layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sub {
    Attn,
    Ffn,
}

/// Which compressor of an attention layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compressor {
    /// The KV compressor (compressed attention rows).
    Kv,
    /// The indexer's compressor (the rows the indexer scores).
    Indexer,
}

/// A concurrent lane of work within a step. Lane 0 is the main one; a backend with several queues
/// (CUDA streams) runs the other lanes beside it, one without ignores them (everything in order).
pub type Lane = usize;

/// What the stage needs to know about a resident layer to order its ops.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LayerInfo {
    /// Compression ratio (0: no compressed rows).
    pub ratio: usize,
    pub indexer: bool,
    pub shared_expert: bool,
}

/// The device ops of the forward pass. `li` is the index of a layer among the resident ones.
/// Buffers are the backend's: ops read and write named activations (streams, xn, q, kv row, …) that
/// the backend allocated once from the memory plan; nothing here allocates.
pub trait DeviceOps {
    /// Makes the device current on the calling thread (a stage may move between threads).
    fn bind(&mut self) -> Result<()>;
    fn layer(&self, li: usize) -> LayerInfo;
    fn has_embed(&self) -> bool;
    fn has_head(&self) -> bool;
    /// Rows in the embedding table (token ids must be below it).
    fn embed_rows(&self) -> usize;
    /// Whether token ids index a per-layer table (hash routing): then they are checked against the vocabulary.
    fn hash_routed(&self) -> bool;

    // Step inputs.
    /// Prepares a step: uploads the token ids (and for a decode step the position the device reads).
    fn begin_step(&mut self, step: Step, tokens: &[u32]) -> Result<()>;
    /// The HC streams of the step from the host (a stage without embedding).
    fn load_hidden(&mut self, h: &[f32]) -> Result<()>;
    /// The token embeddings into every HC stream.
    fn embed(&mut self, step: Step) -> Result<()>;

    // Lanes (no-ops for a backend that runs everything in order).
    /// Continues on `lane` after what the main lane has issued so far.
    fn fork(&mut self, _lane: Lane) -> Result<()> { Ok(()) }
    /// Back to the main lane (the side lane keeps running).
    fn to_main(&mut self) {}
    /// The main lane waits for `lane`.
    fn join(&mut self, _lane: Lane) -> Result<()> { Ok(()) }

    // A layer's sub-layers.
    /// Sub-layer entry: HC mix, Sinkhorn, collapse and norm of the streams into xn.
    fn hc_entry(&mut self, li: usize, sub: Sub, step: Step) -> Result<()>;
    /// The shared KV row: projection, norm, rope, QAT.
    fn kv_row(&mut self, li: usize, step: Step) -> Result<()>;
    /// A compressor's update; closed windows become (normed, roped) compressed rows.
    fn compress(&mut self, li: usize, which: Compressor, step: Step) -> Result<()>;
    /// The indexer's per-head weights (from xn).
    fn indexer_weights(&mut self, li: usize, step: Step) -> Result<()>;
    /// The query's low-rank projection (q_a) and its norm.
    fn q_lora(&mut self, li: usize, step: Step) -> Result<()>;
    /// The indexer's queries (from the normalised low-rank query), roped.
    fn indexer_query(&mut self, li: usize, step: Step) -> Result<()>;
    /// The attention queries (q_b), per-head norm and rope (a backend may defer those into `attend`).
    fn q_heads(&mut self, li: usize, step: Step) -> Result<()>;
    /// Indexer scores over the compressed rows and the top-k selection of each token.
    fn indexer_select(&mut self, li: usize, step: Step) -> Result<()>;
    /// Attention over the window and the compressed rows (the selected ones when `selected`), with
    /// the sinks; stores the new KV rows in the window ring.
    fn attend(&mut self, li: usize, step: Step, selected: bool) -> Result<()>;
    /// The grouped output projections and the attention sub-layer's exit into the streams.
    fn attn_out(&mut self, li: usize, step: Step) -> Result<()>;
    /// The shared expert (SwiGLU of its gate and up products, then down).
    fn shared_expert(&mut self, li: usize, step: Step) -> Result<()>;
    /// Gate logits and routing (biased top-k or the hash table): expert ids and weights per token.
    fn route(&mut self, li: usize, step: Step) -> Result<()>;
    /// The routed experts of every token.
    fn experts(&mut self, li: usize, step: Step) -> Result<()>;
    /// Weighted sum of the experts plus the shared expert, and the FFN sub-layer's exit.
    fn ffn_exit(&mut self, li: usize, step: Step) -> Result<()>;
    /// Applies any sub-layer exit the backend deferred (before the streams are read).
    fn flush(&mut self) -> Result<()>;

    // The output head.
    /// Rows `r0..r0 + m` of the streams: collapse and final norm.
    fn head_norm(&mut self, r0: usize, m: usize) -> Result<()>;
    /// Logits of the `m` normalised rows.
    fn logits(&mut self, m: usize) -> Result<()>;
    /// Greedy pick of the last logits row (index and log-probability), left on the device.
    fn argmax(&mut self) -> Result<()>;
    /// Most logits rows `argmax_rows` picks in one step (1: only `argmax`'s one row).
    fn top1_rows(&self) -> usize { 1 }
    /// Greedy pick of each of the `m` logits rows, left on the device (a verify step's rows).
    fn argmax_rows(&mut self, _m: usize) -> Result<()> { Err("this backend picks one logits row on the device".into()) }

    // Results to the host.
    /// Waits for everything issued.
    fn sync(&mut self) -> Result<()>;
    fn read_logits(&mut self, dst: &mut [f32]) -> Result<()>;
    fn read_hidden(&mut self, dst: &mut [f32]) -> Result<()>;
    fn read_top1(&mut self) -> Result<(u32, f32)>;
    /// The picks of the last `argmax_rows`, one per row.
    fn read_top1_rows(&mut self, _dst: &mut [(u32, f32)]) -> Result<()> { Err("this backend picks one logits row on the device".into()) }
    /// Logits row `row` of the last step's head (`dst` holds one row).
    fn read_logits_row(&mut self, row: usize, dst: &mut [f32]) -> Result<()> {
        let v = dst.len();
        let mut all = vec![0f32; (row + 1) * v];
        self.read_logits(&mut all)?;
        dst.copy_from_slice(&all[row * v..]);
        Ok(())
    }

    // KV state.
    /// Fresh state (position 0).
    fn reset_state(&mut self) -> Result<()>;
    /// Saves (`restore` false) or restores the mutable state (window ring, compressor frontiers).
    fn snapshot(&mut self, restore: bool) -> Result<()>;
    /// Copies the device state of the resident layers into `kv`.
    fn download_kv(&mut self, kv: &mut KvState) -> Result<()>;
    /// Makes `kv` the device state of the resident layers.
    fn upload_kv(&mut self, kv: &KvState) -> Result<()>;

    // KV slots: several sequences resident at once (batched decode of several sessions). Slot 0 is the
    // state every backend has; `select_slot` picks the slot that `begin_step` and the state ops
    // (`reset_state`, `snapshot`, `download_kv`, `upload_kv`) work on. A backend with one slot keeps
    // these defaults.
    /// KV slots held (fixed when the backend was built).
    fn slots(&self) -> usize { 1 }
    /// The slot later single-sequence steps and state ops use.
    fn select_slot(&mut self, slot: usize) -> Result<()> {
        if slot == 0 { Ok(()) } else { Err(format!("this backend holds one KV state, not slot {slot}").into()) }
    }
    /// Prepares a batched step (`step.batch`): row r feeds `tokens[r]` to the sequence in slot
    /// `rows[r].0` at position `rows[r].1` (distinct slots). The attention-family ops then read each
    /// row's slot and position; the other ops run on all rows at once.
    fn begin_batch(&mut self, _step: Step, _rows: &[(usize, usize)], _tokens: &[u32]) -> Result<()> {
        Err("this backend cannot decode several sequences in one step".into())
    }

    // Speculative verification: a second saved copy of the mutable state, taken before a verify
    // step and restored when drafts are rejected.
    fn can_checkpoint(&self) -> bool { false }
    /// Most tokens a verify step (a journaled multi-token forward) runs as the rows of a batched step
    /// over the selected slot at consecutive positions (`begin_batch` with that slot repeated), for a
    /// backend whose multi-token steps round differently from its decode steps: each row is then
    /// computed as its decode step computes it. 0: the backend's short steps already give the decode
    /// rows bit for bit (or it cannot), and verify steps run as ordinary steps.
    fn verify_rows(&self) -> usize { 0 }
    /// Saves (`restore` false) or restores the checkpoint (window ring, compressor frontiers).
    fn checkpoint(&mut self, _restore: bool) -> Result<()> { Err("this backend cannot checkpoint its KV state".into()) }
    /// Most rows of a journaled step this backend undoes in place (`undo_save` before the step,
    /// `undo_rows` to roll part of it back), instead of restoring a checkpoint and running the kept
    /// tokens again. 0: it checkpoints (`checkpoint`).
    fn undo_rows_cap(&self) -> usize { 0 }
    /// Before a journaled step of `n` rows at `pos..pos + n` of the selected slot: keeps what the step
    /// will overwrite and cannot recompute (window ring rows, compressor frontiers).
    fn undo_save(&mut self, _pos: usize, _n: usize) -> Result<()> { Err("this backend cannot undo a step in place".into()) }
    /// After that step: returns the state to the one after its first `keep` rows (`keep` < `n`),
    /// exactly the state decoding those rows alone leaves.
    fn undo_rows(&mut self, _pos: usize, _n: usize, _keep: usize) -> Result<()> { Err("this backend cannot undo a step in place".into()) }

    // Decode replay: a backend that can record a decode step's ops once and replay them.
    fn can_replay(&self) -> bool { false }
    /// Whether a decode step of kind `key` is recorded (for position `pos`, where recordings are
    /// per position: see `replay_consumes`).
    fn has_replay(&self, _key: usize, _pos: usize) -> bool { false }
    /// Starts recording `step`'s ops (a backend whose recordings read the position on the device is
    /// given position 0).
    fn begin_record(&mut self, _step: Step) -> Result<()> { Err("this backend cannot record a decode step".into()) }
    /// Ends the recording begun by `begin_record` (`ok` false: the body failed, discard it).
    fn end_record(&mut self, _key: usize, _ok: bool) -> Result<()> { Err("this backend cannot record a decode step".into()) }
    fn replay(&mut self, _key: usize) -> Result<()> { Err("this backend cannot replay a decode step".into()) }
    /// Whether a replay uses its recording up (wgpu: a command buffer runs once, and its dispatches
    /// depend on the position). The stage then records each step for its position, and records the
    /// next position's step right after submitting one, while the device runs it.
    fn replay_consumes(&self) -> bool { false }

    // Batched-step replay: a backend whose batched step reads the rows' positions on the device can
    // record the step once for its rows' slots (in order) and replay it while they stay the same.
    /// Whether the batched step begun (`begin_batch`) can be recorded and replayed.
    fn can_replay_batch(&self) -> bool { false }
    /// Whether a batched step for the begun rows' slots is recorded.
    fn has_batch_replay(&self) -> bool { false }
    /// Starts recording the batched step begun.
    fn begin_batch_record(&mut self) -> Result<()> { Err("this backend cannot record a batched step".into()) }
    /// Ends that recording (`ok` false: the body failed, discard it).
    fn end_batch_record(&mut self, _ok: bool) -> Result<()> { Err("this backend cannot record a batched step".into()) }
    /// Replays the recorded batched step of the begun rows' slots.
    fn replay_batch(&mut self) -> Result<()> { Err("this backend cannot replay a batched step".into()) }

    // Directional steering (`ds4_model::steering`): each sub-layer output edited before its exit.
    /// Installs `st` (None removes it); `gate` turns it on or off for the steps that follow (read when
    /// a step is begun or a recorded one submitted).
    fn set_steering(&mut self, st: Option<&ds4_model::steering::Steering>, _gate: std::sync::Arc<std::sync::atomic::AtomicBool>) -> Result<()> {
        if st.is_some() { Err("this backend does not apply directional steering".into()) } else { Ok(()) }
    }
    /// Which rows of the next steps are steered while the gate is on (empty: every row).
    fn steer_rows(&mut self, _rows: &[bool]) {}

    /// Timing hooks of the host side of a step (a measuring aid; no-ops by default).
    fn note_call(&mut self, _one_token: bool) {}
}
