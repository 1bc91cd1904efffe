//! `GpuStage`: the forward pass of a stage on a GPU, with the CPU `Stage::forward` contract, over any
//! backend implementing [`DeviceOps`]. It checks the inputs, keeps the position bookkeeping of every
//! KV slot (device position, the snapshot a session rewinds to), runs the layers, records a decode
//! step once to replay it where the backend can, and decodes several sessions (one slot each) in one
//! batched step (`forward_batch`, the CPU `Stage::forward_batch` contract).
use crate::error::{GpuError, Result};
use crate::ops::{DeviceOps, Step};
use ds4_model::{Config, KvState, LayerRange, Logits};

pub struct GpuStage<D: DeviceOps> {
    pub cfg: Config,
    /// The backend: its weights, KV state and work buffers, and its own switches.
    pub ops: D,
    range: LayerRange,
    nmax: usize,
    ctx: usize,
    /// Per KV slot: the position its device state holds, and the position of its snapshot.
    dev_pos: Vec<usize>,
    snap_pos: Vec<Option<usize>>,
    /// The slot the backend has selected.
    cur: usize,
    /// (slot, position) of each row of a batched step (reused).
    batch_rows: Vec<(usize, usize)>,
    logits_host: Vec<f32>,
    hidden_host: Vec<f32>,
    /// When set, the HC streams after every layer of each forward call are appended here (as the CPU
    /// `Stage::trace`), for layer-by-layer comparison.
    pub trace: Option<Vec<Vec<f32>>>,
    /// Replay recorded decode steps (where the backend can); off, every step issues its ops.
    pub use_replay: bool,
    /// While speculative verification runs (slot 0 only): the position the checkpoint holds and the
    /// tokens fed since.
    journal: Option<Journal>,
    /// A verify step is running (its ops take the decode step's lanes).
    verify_lanes: bool,
    /// Logits rows before the ones the last forward call returns (a verify step computes every
    /// row's logits; asked for the last, it returns that one).
    logits_skip: usize,
    /// Rows of the last step whose greedy picks the device made (a verify step's), and the picks
    /// brought back (`forward_picks`).
    picked_rows: usize,
    picks: Vec<(u32, f32)>,
}

/// The device state saved at `from` and the tokens fed after it (a rollback re-runs a prefix of them).
struct Journal {
    from: usize,
    tokens: Vec<u32>,
    /// On a backend that undoes in place: the last journaled step (position, rows), whose undo is
    /// kept; the journal then starts at that step (`from`), the one step a rollback can undo.
    step: Option<(usize, usize)>,
}

impl<D: DeviceOps> GpuStage<D> {
    /// A stage over `ops`, whose resident layers are `range`, sized for batches of up to `nmax` tokens
    /// and a context of `ctx`. The backend's KV state (every slot) is reset.
    pub fn new(cfg: Config, mut ops: D, range: LayerRange, nmax: usize, ctx: usize) -> Result<Self> {
        ops.bind()?;
        let slots = ops.slots().max(1);
        for s in (0..slots).rev() {
            ops.select_slot(s)?;
            ops.reset_state()?;
        }
        let rows = if ops.has_head() { nmax } else { 1 };
        Ok(Self {
            logits_host: Vec::with_capacity(rows * cfg.n_vocab),
            cfg,
            ops,
            range,
            nmax,
            ctx,
            dev_pos: vec![0; slots],
            snap_pos: vec![None; slots],
            cur: 0,
            batch_rows: Vec::with_capacity(slots),
            hidden_host: Vec::new(),
            trace: None,
            use_replay: true,
            journal: None,
            logits_skip: 0,
            verify_lanes: false,
            picked_rows: 0,
            picks: Vec::with_capacity(nmax),
        })
    }

    /// The layers this stage runs.
    pub fn layers(&self) -> LayerRange { self.range }

    /// KV slots the backend holds: sessions resident at once (`KvState::slot` picks one).
    pub fn slots(&self) -> usize { self.dev_pos.len() }

    /// Selects `kv`'s slot on the backend (checked against the slots held).
    fn use_slot(&mut self, kv: &KvState) -> Result<()> {
        let slots = self.slots();
        if kv.slot >= slots {
            return Err(GpuError::SlotOutOfRange { slot: kv.slot, slots });
        }
        if self.cur != kv.slot {
            self.ops.select_slot(kv.slot)?;
            self.cur = kv.slot;
        }
        Ok(())
    }

    /// Same contract as `Stage::forward`.
    pub fn forward(&mut self, kv: &mut KvState, tokens: &[u32], hidden_in: Option<&[f32]>, want: Logits) -> Result<&[f32]> {
        self.ops.bind()?;
        self.ops.note_call(tokens.len() == 1);
        self.use_slot(kv)?;
        self.logits_skip = 0;
        let rows = self.forward_dev(kv, tokens, hidden_in, want, false)?;
        let (v, skip) = (self.cfg.n_vocab, self.logits_skip);
        self.logits_host.resize((skip + rows) * v, 0.0);
        self.ops.sync()?;
        if rows > 0 {
            self.ops.read_logits(&mut self.logits_host)?;
            self.logits_host.drain(..skip * v);
        }
        Ok(&self.logits_host)
    }

    /// Greedy top-1 of the last logits row and its log-probability, computed on the device (in a
    /// replayed decode step the pick is part of the step). The logits stay on the device for
    /// [`GpuStage::last_logits`].
    pub fn forward_argmax(&mut self, kv: &mut KvState, tokens: &[u32], hidden_in: Option<&[f32]>) -> Result<(u32, f32)> {
        self.ops.bind()?;
        self.ops.note_call(tokens.len() == 1);
        if !self.ops.has_head() {
            return Err(GpuError::NoHead);
        }
        self.use_slot(kv)?;
        if self.forward_dev(kv, tokens, hidden_in, Logits::Last, true)? == 0 {
            return Err(GpuError::NoHead);
        }
        self.ops.sync()?;
        self.ops.read_top1()
    }

    /// Feeds `tokens` (token input) and returns the greedy pick (index, log-probability) of every
    /// row: picked on the device where the step did (a verify step on a backend with `top1_rows`),
    /// else from the downloaded logits (lowest index on ties, as the device). The logits rows stay on
    /// the device for [`GpuStage::logits_row`].
    pub fn forward_picks(&mut self, kv: &mut KvState, tokens: &[u32]) -> Result<&[(u32, f32)]> {
        self.ops.bind()?;
        self.ops.note_call(tokens.len() == 1);
        if !self.ops.has_head() {
            return Err(GpuError::NoHead);
        }
        self.use_slot(kv)?;
        self.picked_rows = 0;
        let n = tokens.len();
        // One token: the decode step's own device pick (the logits row stays on the device too).
        let top1 = n == 1;
        let rows = self.forward_dev(kv, tokens, None, Logits::All, top1)?;
        self.ops.sync()?;
        self.picks.clear();
        if top1 && rows == 1 {
            self.picks.push(self.ops.read_top1()?);
        } else if rows == n && self.picked_rows == n {
            self.picks.resize(n, (0, 0.0));
            self.ops.read_top1_rows(&mut self.picks)?;
        } else {
            let v = self.cfg.n_vocab;
            self.logits_host.resize(rows * v, 0.0);
            self.ops.read_logits(&mut self.logits_host)?;
            self.picks.extend(self.logits_host.chunks(v).map(greedy_pick));
        }
        Ok(&self.picks)
    }

    /// Logits row `row` of the last forward call, downloaded.
    pub fn logits_row(&mut self, row: usize) -> Result<&[f32]> {
        self.ops.bind()?;
        self.logits_host.resize(self.cfg.n_vocab, 0.0);
        self.ops.read_logits_row(row, &mut self.logits_host)?;
        Ok(&self.logits_host)
    }

    /// The logits row of the last forward call that asked for the last row, downloaded.
    pub fn last_logits(&mut self) -> Result<&[f32]> {
        self.ops.bind()?;
        self.logits_host.resize(self.cfg.n_vocab, 0.0);
        self.ops.read_logits(&mut self.logits_host)?;
        Ok(&self.logits_host)
    }

    /// The HC streams after the last forward call (n × hc_dim), downloaded.
    pub fn hidden(&mut self, n: usize) -> Result<&[f32]> {
        self.ops.bind()?;
        self.hidden_host.resize(n * self.cfg.hc_dim(), 0.0);
        self.ops.read_hidden(&mut self.hidden_host)?;
        Ok(&self.hidden_host)
    }

    /// Copies the device KV state of this stage's layers into `kv` (which must be at the position the
    /// device holds, or at its snapshot's): what a session file or the disk KV cache saves.
    pub fn download_kv(&mut self, kv: &mut KvState) -> Result<()> {
        self.ops.bind()?;
        self.use_slot(kv)?;
        self.sync_state(kv.pos)?;
        self.ops.sync()?;
        self.ops.download_kv(kv)
    }

    /// Makes `kv` (restored from a file, or from another backend) the device state; the next forward
    /// call continues from `kv.pos`. Nothing is written when `kv` does not match the stage's layers.
    pub fn upload_kv(&mut self, kv: &KvState) -> Result<()> {
        self.ops.bind()?;
        if kv.pos > self.ctx {
            return Err(GpuError::KvBeyondContext { pos: kv.pos, ctx: self.ctx });
        }
        self.use_slot(kv)?;
        let s = self.cur;
        match self.ops.upload_kv(kv) {
            Ok(()) => {
                self.dev_pos[s] = kv.pos;
                // As after a prefill: a later rewind to this position finds it.
                self.ops.snapshot(false)?;
                self.snap_pos[s] = Some(kv.pos);
                self.ops.sync()
            }
            Err(e) => {
                // A failed copy part-way leaves a mixed state: only a fresh start is valid now.
                self.snap_pos[s] = None;
                self.dev_pos[s] = usize::MAX;
                Err(e)
            }
        }
    }

    /// Whether the backend can undo forward calls (`begin_journal` / `rollback`).
    pub fn can_journal(&self) -> bool {
        self.ops.undo_rows_cap() > 0 || self.ops.can_checkpoint()
    }

    /// Starts speculative verification at `kv.pos`: later forward calls (token input only) can be
    /// undone by [`GpuStage::rollback`]. A backend that undoes in place (`undo_rows_cap`) keeps what
    /// each journaled step overwrites, and a rollback undoes the last step (a verify step: the rows
    /// of the rejected drafts); any other has its state checkpointed here and re-runs kept tokens.
    pub fn begin_journal(&mut self, kv: &KvState) -> Result<()> {
        self.ops.bind()?;
        let in_place = self.ops.undo_rows_cap() > 0;
        if !in_place && !self.ops.can_checkpoint() {
            return Err(GpuError::Journal("this GPU backend cannot roll its KV state back"));
        }
        if kv.slot != 0 {
            return Err(GpuError::Journal("speculative verification runs in KV slot 0 only"));
        }
        self.use_slot(kv)?;
        self.sync_state(kv.pos)?;
        if !in_place {
            self.ops.checkpoint(false)?;
            self.ops.sync()?;
        }
        self.journal = Some(Journal { from: kv.pos, tokens: Vec::new(), step: None });
        Ok(())
    }

    /// Returns the device state and `kv.pos` to `pos`, between the journal's start and now. In place
    /// (`undo_rows_cap`): the last step's rows after `pos` are undone. Otherwise the checkpoint is
    /// restored and the tokens fed up to `pos` run again. Either way the state is the one a forward
    /// of the kept tokens left (the backend's rows are bit-identical to decode steps).
    pub fn rollback(&mut self, kv: &mut KvState, pos: usize) -> Result<()> {
        self.ops.bind()?;
        let Some(j) = self.journal.as_ref() else { return Err(GpuError::Journal("rollback without a journal")) };
        let (to, step) = (j.from + j.tokens.len(), j.step);
        if kv.slot != 0 {
            return Err(GpuError::Journal("the journal is slot 0's"));
        }
        if pos < j.from || pos > to || kv.pos != to {
            return Err(GpuError::RollbackOutOfRange { pos, from: j.from, to });
        }
        if pos == to {
            return Ok(());
        }
        self.use_slot(kv)?;
        if let Some((at, n)) = step {
            // In place: the rejected rows' writes undone, nothing runs again.
            self.ops.undo_rows(at, n, pos - at)?;
            self.journal.as_mut().expect("checked above").tokens.truncate(pos - at);
            self.dev_pos[0] = pos;
            kv.pos = pos;
            if self.snap_pos[0].is_some_and(|s| s > pos) {
                self.snap_pos[0] = None;
            }
            return Ok(self.ops.sync()?);
        }
        let mut j = self.journal.take().expect("checked above");
        let from = j.from;
        j.tokens.truncate(pos - from);
        self.ops.checkpoint(true)?;
        self.dev_pos[0] = from;
        kv.pos = from;
        // The prefill snapshot may hold a position past the rollback: no longer on this sequence.
        if self.snap_pos[0].is_some_and(|s| s > from) {
            self.snap_pos[0] = None;
        }
        // Re-run without the journal (it would record the tokens again), then keep them in it. Several
        // tokens run as a verify step where the backend needs one for decode rows bit for bit.
        let n = j.tokens.len();
        if n > 1 && n <= self.ops.verify_rows() {
            self.verify_rows(kv, &j.tokens, Logits::None)?;
        } else if n > 0 {
            self.forward_dev(kv, &j.tokens, None, Logits::None, false)?;
        }
        self.ops.sync()?;
        self.journal = Some(j);
        Ok(())
    }

    /// Ends the journal, keeping the state.
    pub fn end_journal(&mut self) {
        self.journal = None;
    }

    /// Brings the selected slot's device state to `pos` (0 = fresh, the current position, or the
    /// last snapshot).
    fn sync_state(&mut self, pos: usize) -> Result<()> {
        let s = self.cur;
        if pos == 0 {
            if self.dev_pos[s] != 0 {
                self.ops.reset_state()?;
                self.dev_pos[s] = 0;
            }
            return Ok(());
        }
        if pos == self.dev_pos[s] {
            return Ok(());
        }
        if self.snap_pos[s] == Some(pos) {
            self.ops.snapshot(true)?;
            self.dev_pos[s] = pos;
            return Ok(());
        }
        Err(GpuError::StateNotOnDevice { pos, dev: self.dev_pos[s], snap: self.snap_pos[s] })
    }

    /// Tokens a forward call may take (the batch the work buffers were sized for).
    pub fn nmax(&self) -> usize { self.nmax }

    fn check(&self, kv: &KvState, tokens: &[u32], hidden_in: Option<&[f32]>) -> Result<()> {
        let n = tokens.len();
        if n > self.nmax {
            return Err(GpuError::BatchTooLarge { n, nmax: self.nmax });
        }
        if kv.pos + n > kv.ctx || kv.pos + n > self.ctx {
            return Err(GpuError::ContextFull { pos: kv.pos, n, ctx: kv.ctx.min(self.ctx) });
        }
        if self.ops.hash_routed() {
            if let Some(&t) = tokens.iter().find(|&&t| t as usize >= self.cfg.n_vocab) {
                return Err(GpuError::TokenOutOfRange { token: t, vocab: self.cfg.n_vocab });
            }
        }
        match hidden_in {
            Some(h) if h.len() != n * self.cfg.hc_dim() => Err(GpuError::HiddenSize { got: h.len(), want: n * self.cfg.hc_dim() }),
            Some(_) => Ok(()),
            None if !self.ops.has_embed() => Err(GpuError::NoEmbedding),
            None => match tokens.iter().find(|&&t| t as usize >= self.ops.embed_rows()) {
                Some(&t) => Err(GpuError::TokenOutOfRange { token: t, vocab: self.ops.embed_rows() }),
                None => Ok(()),
            },
        }
    }

    /// Runs the forward pass, leaving logits rows (and with `top1` the greedy pick) on the device;
    /// returns the row count.
    fn forward_dev(&mut self, kv: &mut KvState, tokens: &[u32], hidden_in: Option<&[f32]>, want: Logits, top1: bool) -> Result<usize> {
        let n = tokens.len();
        if n == 0 {
            return Ok(0);
        }
        self.check(kv, tokens, hidden_in)?;
        self.sync_state(kv.pos)?;
        let journaled = self.cur == 0 && self.journal.is_some();
        if let Some(j) = self.journal.as_mut().filter(|_| journaled) {
            if hidden_in.is_some() || kv.pos != j.from + j.tokens.len() {
                return Err(GpuError::Journal("a journaled stage takes consecutive token input"));
            }
            let cap = self.ops.undo_rows_cap();
            if cap > 0 {
                if n > cap {
                    return Err(GpuError::JournalStepTooLong { n, cap });
                }
                // Only the last step is undone in place: the journal starts again at this one.
                j.from = kv.pos;
                j.tokens.clear();
                j.step = Some((kv.pos, n));
                self.ops.undo_save(kv.pos, n)?;
            }
        }
        if journaled && hidden_in.is_none() && !top1 && n > 1 && n <= self.ops.verify_rows() {
            return self.verify_rows(kv, tokens, want);
        }
        let d = self.cfg.head_dim;
        let step = Step { n, pos0: kv.pos, decode: n == 1 && d % 4 == 0 && d <= 1024, batch: false };
        self.ops.begin_step(step, tokens)?;
        if let Some(h) = hidden_in {
            self.ops.load_hidden(h)?;
        }
        let head = want != Logits::None && self.ops.has_head();
        let rows = if head { if want == Logits::Last { 1 } else { n } } else { 0 };
        if step.decode && self.use_replay && self.trace.is_none() && self.ops.can_replay() {
            // Kinds: hidden input or token, then no head / logits / logits and their argmax.
            let key = 3 * hidden_in.is_some() as usize + head as usize + (head && top1) as usize;
            let per_pos = self.ops.replay_consumes();
            // Recorded once for every position (the ops read it on the device), or per position.
            let rec = if per_pos { step } else { Step { pos0: 0, ..step } };
            if !self.ops.has_replay(key, step.pos0) {
                self.record(key, rec, hidden_in.is_none(), head, top1)?;
            }
            self.ops.replay(key)?;
            if per_pos && step.pos0 + 2 <= self.ctx {
                // The next position's step is recorded while the device runs this one; one that
                // cannot be recorded (e.g. past a capacity) is left to its own call, which reports it.
                let next = Step { pos0: step.pos0 + 1, ..step };
                let _ = self.record(key, next, hidden_in.is_none(), head, top1);
            }
        } else {
            let r0 = if want == Logits::Last { n - 1 } else { 0 };
            self.run(step, hidden_in.is_none(), head.then_some((r0, rows)), head && top1)?;
        }
        kv.pos += n;
        self.dev_pos[self.cur] = kv.pos;
        if let Some(j) = self.journal.as_mut().filter(|_| journaled) {
            j.tokens.extend_from_slice(tokens);
        }
        if n > 1 {
            self.ops.snapshot(false)?;
            self.snap_pos[self.cur] = Some(kv.pos);
        }
        Ok(rows)
    }

    /// A verify step (`DeviceOps::verify_rows`): the tokens as the rows of a batched step over the
    /// selected slot at consecutive positions, each row computed as its decode step computes it, so
    /// the state and logits are those of decoding the tokens one by one. The head runs on every row
    /// (one recording serves every verify step of `n` rows); `want` picks the rows returned.
    fn verify_rows(&mut self, kv: &mut KvState, tokens: &[u32], want: Logits) -> Result<usize> {
        let n = tokens.len();
        let slot = self.cur;
        self.batch_rows.clear();
        self.batch_rows.extend((0..n).map(|r| (slot, kv.pos + r)));
        let step = Step { n, pos0: kv.pos + n - 1, decode: false, batch: true };
        self.ops.begin_batch(step, &self.batch_rows, tokens)?;
        let head = self.ops.has_head();
        // Each row's greedy pick too, where the device can (the verify loop then brings back picks,
        // not logits rows).
        let top1 = head && n <= self.ops.top1_rows();
        self.verify_lanes = true;
        let r = self.replay_batch_step(step, head.then_some((0, n)), top1);
        self.verify_lanes = false;
        r?;
        self.picked_rows = if top1 { n } else { 0 };
        kv.pos += n;
        self.dev_pos[slot] = kv.pos;
        if let Some(j) = self.journal.as_mut().filter(|_| slot == 0) {
            j.tokens.extend_from_slice(tokens);
        }
        // (No snapshot, unlike other multi-token steps: a verify step is rolled back or continued.)
        self.logits_skip = if head && want == Logits::Last { n - 1 } else { 0 };
        Ok(match want {
            _ if !head => 0,
            Logits::None => 0,
            Logits::Last => 1,
            Logits::All => n,
        })
    }

    /// Runs the batched step begun, from its recording where the backend records batched steps.
    fn replay_batch_step(&mut self, step: Step, head: Option<(usize, usize)>, top1: bool) -> Result<()> {
        if self.use_replay && self.trace.is_none() && self.ops.can_replay_batch() {
            // Recorded once for these slots (the rows' positions are read on the device), then replayed.
            if !self.ops.has_batch_replay() {
                self.ops.begin_batch_record()?;
                let body = self.run(step, true, head, top1);
                self.ops.end_batch_record(body.is_ok())?;
                body?;
            }
            self.ops.replay_batch()
        } else {
            self.run(step, true, head, top1)
        }
    }

    /// Records a decode step of kind `key` for replay.
    fn record(&mut self, key: usize, step: Step, embed: bool, head: bool, top1: bool) -> Result<()> {
        self.ops.begin_record(step)?;
        let body = self.run(step, embed, head.then_some((0, 1)), head && top1);
        self.ops.end_record(key, body.is_ok())?;
        body

    }

    /// One decode step for several sequences, each resident in its own KV slot (`kvs[r].slot`, all
    /// different): `tokens[r]` is fed to `kvs[r]` at its own position. Same contract as the CPU
    /// `Stage::forward_batch`: one logits row per sequence in the order of `kvs` (none on a stage
    /// without the head), each bit-identical to a decode step of that sequence alone. Every weight is
    /// read once for the batch.
    pub fn forward_batch(&mut self, kvs: &mut [&mut KvState], tokens: &[u32]) -> Result<&[f32]> {
        self.ops.bind()?;
        let n = kvs.len();
        if n != tokens.len() {
            return Err(GpuError::BatchMismatch { kvs: n, tokens: tokens.len() });
        }
        if n == 0 {
            self.logits_host.clear();
            return Ok(&self.logits_host);
        }
        let slots = self.slots();
        if n > slots {
            return Err(GpuError::BatchOverSlots { n, slots });
        }
        if n > self.nmax {
            return Err(GpuError::BatchTooLarge { n, nmax: self.nmax });
        }
        for (r, (kv, t)) in kvs.iter().zip(tokens).enumerate() {
            if kv.slot >= slots {
                return Err(GpuError::SlotOutOfRange { slot: kv.slot, slots });
            }
            if kvs[..r].iter().any(|o| o.slot == kv.slot) {
                return Err(GpuError::SlotTwice { slot: kv.slot });
            }
            if kv.slot == 0 && self.journal.is_some() {
                return Err(GpuError::Journal("a journaled sequence cannot join a batch"));
            }
            self.check(kv, std::slice::from_ref(t), None)?;
        }
        // Every row's slot at its position (a rewind restores the slot's snapshot).
        for kv in kvs.iter() {
            self.use_slot(kv)?;
            self.sync_state(kv.pos)?;
        }
        self.batch_rows.clear();
        self.batch_rows.extend(kvs.iter().map(|kv| (kv.slot, kv.pos)));
        let pos0 = self.batch_rows.iter().map(|r| r.1).max().unwrap_or(0);
        let step = Step { n, pos0, decode: false, batch: true };
        self.ops.note_call(false);
        self.ops.begin_batch(step, &self.batch_rows, tokens)?;
        let head = self.ops.has_head();
        self.replay_batch_step(step, head.then_some((0, n)), false)?;
        for kv in kvs.iter_mut() {
            kv.pos += 1;
            self.dev_pos[kv.slot] = kv.pos;
        }
        let rows = if head { n } else { 0 };
        self.logits_host.resize(rows * self.cfg.n_vocab, 0.0);
        self.ops.sync()?;
        if rows > 0 {
            self.ops.read_logits(&mut self.logits_host)?;
        }
        Ok(&self.logits_host)
    }

    /// The step's ops: embedding, every layer, the head on rows `head` (first, count), the pick.
    fn run(&mut self, step: Step, embed: bool, head: Option<(usize, usize)>, top1: bool) -> Result<()> {
        if embed {
            self.ops.embed(step)?;
        }
        for li in 0..self.range.last + 1 - self.range.first {
            // A verify step's rows are decode steps for the backend: their side chains take lanes too.
            let lanes = step.decode || (step.batch && self.verify_lanes);
            crate::attention::attention(&mut self.ops, &self.cfg, li, step, lanes)?;
            crate::ffn::ffn(&mut self.ops, li, step, lanes)?;
            if self.trace.is_some() {
                self.ops.flush()?;
                let mut h = vec![0f32; step.n * self.cfg.hc_dim()];
                self.ops.read_hidden(&mut h)?;
                self.trace.as_mut().expect("checked above").push(h);
            }
        }
        self.ops.flush()?;
        if let Some((r0, m)) = head {
            self.ops.head_norm(r0, m)?;
            self.ops.logits(m)?;
            if top1 && m == 1 {
                self.ops.argmax()?;
            } else if top1 {
                self.ops.argmax_rows(m)?;
            }
        }
        Ok(())
    }
}

/// The greedy pick of a logits row as the device makes it: the largest value (lowest index on
/// ties; NaN never wins; none: 0) and its log-probability under the row's softmax.
fn greedy_pick(row: &[f32]) -> (u32, f32) {
    let (best, m) = row.iter().enumerate().fold((0, f32::NEG_INFINITY), |b, (i, &x)| if x > b.1 { (i, x) } else { b });
    let sum: f64 = row.iter().filter(|x| !x.is_nan()).map(|&x| ((x - m) as f64).exp()).sum();
    (best as u32, -(sum.ln() as f32))
}
