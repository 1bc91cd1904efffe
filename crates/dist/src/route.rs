//! Executes a conversation over a route of stages: the coordinator's local layers first, then the
//! remote hops in layer order. Decode is one hop chain per token through [`StageExec`]; prefill is
//! pipelined: chunk N+1 runs locally while the workers run chunk N, with at most `window` chunks in
//! flight. A failed stage fails the request with an error naming it; the next request after a
//! compatible worker registers again replays the token history to rebuild the workers' KV.
use crate::coordinator::{stage_error, Coordinator, RemoteStage};
use crate::error::{DistError, Result};
use crate::exec::{is_kv_mismatch, Activations, HopTiming, LocalStage, StageExec, StageRequest};
use crate::protocol::{fnv1a_tokens, ErrorKind, ForwardReq, Payload, Want, FNV_OFFSET};
use crate::prefill_plan::{micro_chunk, CostModel};
use crate::telemetry::{HopRecord, Telemetry};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Debug, Clone)]
pub struct RouteOptions {
    /// Wire format of decode steps (and of prefill unless `prefill_bits` says otherwise).
    pub bits: u8,
    /// Wire format of prefill chunks (None: `bits`).
    pub prefill_bits: Option<u8>,
    /// Largest prefill chunk (the local engine's batch); the micro-chunk when `auto_chunk` is off.
    pub prefill_chunk: usize,
    /// Pick the pipelined prefill's micro-chunk from measured costs (`prefill_plan`), at most
    /// `prefill_chunk` (on when `--dist-prefill-chunk` is not given).
    pub auto_chunk: bool,
    /// Chunks in flight; None = remote stages + 2 clamped to 2..8 (as the C engine).
    pub prefill_window: Option<usize>,
    pub replay_check: bool,
    pub debug: bool,
}

impl Default for RouteOptions {
    fn default() -> Self { Self { bits: 32, prefill_bits: None, prefill_chunk: 256, auto_chunk: false, prefill_window: None, replay_check: false, debug: false } }
}

/// The greedy result of a step when the last stage samples.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenOut {
    pub id: u32,
    pub logprob: f32,
    pub top: Vec<(u32, f32)>,
}

const ENDED_EARLY: &str = "prefill pipeline ended early";
/// The error of a prefill stopped by its cancel flag.
pub const CANCELLED: &str = "cancelled";

static SESSION_IDS: AtomicU64 = AtomicU64::new(1);

/// A conversation on a route (the distributed counterpart of `ds4_engine::Session`).
pub struct DistSession {
    coord: Option<Arc<Coordinator>>,
    local: LocalStage,
    hops: Vec<Box<dyn StageExec>>,
    generation: u64,
    session: u64,
    pub tokens: Vec<u32>,
    /// Logits after the last consumed token (empty before the first, and after greedy steps).
    pub logits: Vec<f32>,
    hash: u64,
    /// Remote KV may not match `tokens` (after a failure or a route change): replay first.
    dirty: bool,
    pub opts: RouteOptions,
    pub telemetry: Telemetry,
    /// Measured prefill costs (for the micro-chunk).
    pub costs: CostModel,
    next_request: Arc<AtomicU64>,
}

impl DistSession {
    /// A session over `coord`'s route (None: a single-process route of the local stage alone).
    pub fn new(local: LocalStage, coord: Option<Arc<Coordinator>>, opts: RouteOptions) -> Self {
        let next_request = coord.as_ref().map(|c| c.next_request.clone()).unwrap_or_else(|| Arc::new(AtomicU64::new(1)));
        Self {
            coord,
            local,
            hops: Vec::new(),
            generation: u64::MAX,
            session: SESSION_IDS.fetch_add(1, Ordering::Relaxed) | ((std::process::id() as u64) << 32),
            tokens: Vec::new(),
            logits: Vec::new(),
            hash: FNV_OFFSET,
            dirty: false,
            telemetry: Telemetry::new(opts.debug),
            costs: CostModel::default(),
            opts,
            next_request,
        }
    }

    pub fn local(&self) -> &LocalStage { &self.local }
    pub fn n_hops(&self) -> usize { self.hops.len() }
    pub fn ctx(&self) -> usize { self.local.ctx() }

    fn window(&self, n_chunks: usize) -> usize {
        let w = self.opts.prefill_window.unwrap_or_else(|| (self.hops.len() + 2).clamp(2, 8));
        w.clamp(1, 64).min(n_chunks.max(1))
    }

    /// Makes sure the hops match the coordinator's current route; a changed route means the remote
    /// KV is gone, so the history must be replayed.
    fn refresh_route(&mut self) -> Result<()> {
        let Some(c) = &self.coord else { return Ok(()) };
        let gen = c.generation();
        if gen == self.generation && !self.hops.is_empty() {
            return Ok(());
        }
        let plan = c.plan()?;
        self.hops = plan
            .workers
            .iter()
            .enumerate()
            .map(|(i, w)| Box::new(RemoteStage::new(w.clone(), i + 1, self.next_request.clone())) as Box<dyn StageExec>)
            .collect();
        if self.generation != u64::MAX && plan.generation != self.generation && !self.tokens.is_empty() {
            self.dirty = true;
        }
        self.generation = plan.generation;
        Ok(())
    }

    /// Drops the conversation on every stage.
    pub fn reset(&mut self) {
        self.local.drop_sessions(Some(self.session));
        for h in &mut self.hops {
            let _ = h.reset(Some(self.session));
        }
        self.tokens.clear();
        self.logits.clear();
        self.hash = FNV_OFFSET;
        self.dirty = false;
    }

    #[allow(clippy::too_many_arguments)]
    fn record(&mut self, request: u64, hop: Option<usize>, layers: String, location: String, pos: usize, tokens: usize, chunk: Option<(usize, usize)>, timing: HopTiming) {
        if chunk.is_some() {
            match hop {
                None => self.costs.add_local(tokens, timing.eval.as_secs_f64()),
                Some(_) => self.costs.add_hop(tokens, timing.forward_send.as_secs_f64()),
            }
        }
        self.telemetry.push(HopRecord { request, hop, layers, location, pos, tokens, chunk, timing });
    }

    fn prefill_bits(&self) -> u8 { self.opts.prefill_bits.unwrap_or(self.opts.bits) }

    /// Rebuilds every stage's KV from the token history (after a failure, a route change or a KV
    /// mismatch). With `--dist-replay-check` the replayed logits must equal the ones held.
    ///
    /// A replay that fails (a stage fails again, e.g. the route is still the one with the failed
    /// worker, or the replay check fails) leaves the session as it was: the same history, hash
    /// and logits, still dirty, so the next request replays the whole history again. (It used
    /// to leave an empty, clean session: the next request after a worker restart then ran at
    /// position 0 and returned the logits of a one-token conversation.)
    fn replay(&mut self, why: &str) -> Result<()> {
        let history = std::mem::take(&mut self.tokens);
        let held = std::mem::take(&mut self.logits);
        let hash = self.hash;
        eprintln!("ds4: distributed coordinator: replaying {} tokens after {why}", history.len());
        self.reset();
        if history.is_empty() {
            return Ok(());
        }
        let want = if held.is_empty() { Want::Ack } else { Want::LastLogits };
        let r = self.prefill_span(&history, want, &AtomicBool::new(false)).and_then(|()| {
            // With prefill and decode in different wire formats the replay (all prefill) cannot equal
            // a history that was partly decoded: nothing to check then.
            if self.opts.replay_check && !held.is_empty() && self.prefill_bits() == self.opts.bits {
                if self.logits != held {
                    let d = self.logits.iter().zip(&held).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
                    return Err(DistError::Stage(format!("distributed replay check failed: logits differ after replay (max |d| {d:e})")));
                }
                eprintln!("ds4: distributed replay check passed ({} tokens)", history.len());
            }
            Ok(())
        });
        if r.is_err() {
            // The stages hold some prefix of the history (or none): replay it all next time.
            self.tokens = history;
            self.logits = held;
            self.hash = hash;
            self.dirty = true;
        }
        r
    }

    fn prepare(&mut self) -> Result<()> {
        self.refresh_route()?;
        if self.dirty {
            self.replay("distributed route failure")?;
        }
        Ok(())
    }

    /// Runs `f`; a failure marks the remote KV dirty; a KV mismatch is repaired once by replay.
    fn with_repair<T>(&mut self, mut f: impl FnMut(&mut Self) -> Result<T>) -> Result<T> {
        self.prepare()?;
        match f(self) {
            Ok(v) => Ok(v),
            Err(e) if is_kv_mismatch(&e) => {
                self.dirty = true;
                self.replay("KV mismatch")?;
                f(self).inspect_err(|_| self.dirty = true)
            }
            Err(e) => {
                self.dirty = true;
                Err(e)
            }
        }
    }

    /// Makes the session hold exactly `prompt` (prefix reuse when it extends the history) and
    /// returns the logits after its last token.
    pub fn sync(&mut self, prompt: &[u32]) -> Result<&[f32]> { self.sync_cancellable(prompt, &AtomicBool::new(false)) }

    /// [`DistSession::sync`] that stops between prefill chunks once `cancel` is set (error
    /// [`CANCELLED`]; the workers may then hold more than the history, so the next request that
    /// extends it replays).
    pub fn sync_cancellable(&mut self, prompt: &[u32], cancel: &AtomicBool) -> Result<&[f32]> {
        if prompt.is_empty() {
            return Err(DistError::Other("empty prompt".into()));
        }
        if prompt.len() > self.ctx() {
            return Err(DistError::Other(format!("prompt has {} tokens, context is {}", prompt.len(), self.ctx())));
        }
        let reuse = !self.tokens.is_empty() && prompt.len() > self.tokens.len() && prompt.starts_with(&self.tokens);
        if !reuse {
            self.reset();
        }
        let start = self.tokens.len();
        let todo = prompt[start..].to_vec();
        self.with_repair(|s| s.prefill_span(&todo, Want::LastLogits, cancel))?;
        Ok(&self.logits)
    }

    /// Feeds one token; returns the full logits (from the last stage).
    pub fn step(&mut self, token: u32) -> Result<&[f32]> {
        self.with_repair(|s| match s.chain(&[token], Want::LastLogits, s.opts.bits, None)? {
            Payload::Logits(l) => {
                s.logits = l;
                s.commit(&[token]);
                Ok(())
            }
            p => Err(DistError::Protocol(format!("expected logits, got {p:?}"))),
        })?;
        Ok(&self.logits)
    }

    /// Feeds one token; the last stage picks the greedy next token and sends only its id.
    pub fn step_greedy(&mut self, token: u32, top_logprobs: u8) -> Result<TokenOut> {
        self.with_repair(|s| match s.chain(&[token], Want::Greedy { top_logprobs }, s.opts.bits, None)? {
            Payload::Token { id, logprob, top } => {
                s.logits.clear();
                s.commit(&[token]);
                Ok(TokenOut { id, logprob, top })
            }
            p => Err(DistError::Protocol(format!("expected a token, got {p:?}"))),
        })
    }

    fn commit(&mut self, toks: &[u32]) {
        self.hash = fnv1a_tokens(self.hash, toks);
        self.tokens.extend_from_slice(toks);
    }

    fn request_id(&self) -> u64 { self.next_request.fetch_add(1, Ordering::Relaxed) }

    /// One pass of `toks` through every stage in order (decode, and prefill without pipelining).
    fn chain(&mut self, toks: &[u32], want: Want, bits: u8, chunk: Option<(usize, usize)>) -> Result<Payload> {
        if self.tokens.len() + toks.len() > self.ctx() {
            return Err(DistError::Other(format!("context full: {} + {} tokens exceeds ctx {}", self.tokens.len(), toks.len(), self.ctx())));
        }
        let rid = self.request_id();
        let pos = self.tokens.len();
        let n_stages = 1 + self.hops.len();
        let mut input: Option<Activations> = None;
        for i in 0..n_stages {
            let last = i + 1 == n_stages;
            let req = StageRequest {
                session: self.session,
                pos,
                prefix_hash: self.hash,
                tokens: toks,
                input: input.as_ref().map(Activations::as_ref),
                want: if last { want } else { Want::Hidden },
                bits,
            };
            let stage: &mut dyn StageExec = if i == 0 { &mut self.local } else { self.hops[i - 1].as_mut() };
            let info = stage.info();
            let out = stage.forward(&req)?;
            self.record(rid, (i > 0).then_some(i), info.range.label(), info.location, pos, toks.len(), chunk, out.timing);
            if last {
                return Ok(out.payload);
            }
            input = match out.payload {
                Payload::Hidden { bits, data } => Some(Activations { bits, data }),
                p => return Err(DistError::Protocol(format!("stage {i} returned {p:?} instead of hidden states"))),
            };
        }
        unreachable!("a route has at least the local stage")
    }

    /// Prefill of `toks` after the history; sets `logits` when `want` is LastLogits.
    fn prefill_span(&mut self, toks: &[u32], want: Want, cancel: &AtomicBool) -> Result<()> {
        if toks.is_empty() {
            return Ok(());
        }
        if self.tokens.len() + toks.len() > self.ctx() {
            return Err(DistError::Other(format!("context full: {} + {} tokens exceeds ctx {}", self.tokens.len(), toks.len(), self.ctx())));
        }
        let bits = self.prefill_bits();
        for h in &self.hops {
            if let Some(w) = h.remote() {
                if !w.reg.activation_bits.contains(&bits) {
                    return Err(DistError::Stage(format!("worker {} does not accept {bits}-bit activations (accepts {:?})", w.label(), w.reg.activation_bits)));
                }
            }
        }
        let max_chunk = self.opts.prefill_chunk.max(1);
        let chunk = if self.opts.auto_chunk { micro_chunk(toks.len(), 1 + self.hops.len(), max_chunk, self.costs.fit()) } else { max_chunk };
        let pipelined = self.hops.iter().all(|h| h.remote().is_some()) && !self.hops.is_empty() && toks.len() > chunk;
        if self.opts.debug && self.opts.auto_chunk {
            eprintln!("ds4: distributed coordinator: prefill micro-chunk {chunk} of at most {max_chunk} for {} tokens (measured costs: {:?})", toks.len(), self.costs.fit());
        }
        if !pipelined {
            let n = toks.len().div_ceil(chunk);
            for (k, c) in toks.chunks(chunk).enumerate() {
                if cancel.load(Ordering::Relaxed) {
                    return Err(DistError::Other(CANCELLED.into()));
                }
                let w = if k + 1 == n { want } else { Want::Ack };
                match self.chain(c, w, bits, Some((k, n)))? {
                    Payload::Logits(l) => self.logits = l,
                    // The logits held no longer belong to the history once this chunk is in it
                    // (a later chunk may fail or be cancelled; a replay must not check them).
                    Payload::Ack => self.logits.clear(),
                    p => return Err(DistError::Protocol(format!("expected logits or ack, got {p:?}"))),
                }
                self.commit(c);
            }
            return Ok(());
        }
        self.pipelined(toks, want, cancel, chunk, bits)
    }

    /// Pipelined prefill: the local stage computes chunk k+1 while the remote hops run chunk k.
    /// Each hop has an ordered sender and an ordered collector, so chunks reach every worker in
    /// position order; at most `window` chunks are between the local stage and the final result.
    fn pipelined(&mut self, toks: &[u32], want: Want, cancel: &AtomicBool, chunk: usize, bits: u8) -> Result<()> {
        let coord = self.coord.clone().expect("remote hops come from a coordinator");
        let rt = coord.handle();
        let chunks: Vec<&[u32]> = toks.chunks(chunk).collect();
        let n = chunks.len();
        let window = self.window(n);
        let conns: Vec<_> = self.hops.iter().map(|h| (h.remote().unwrap(), h.info())).collect();
        let nh = conns.len();
        let t_start = Instant::now();
        if self.opts.debug {
            eprintln!(
                "ds4: distributed coordinator: pipelined prefill {n} chunks of up to {chunk} tokens through {nh} workers, first hop {}, flow window {window}",
                conns[0].0.peer
            );
        }
        struct Item {
            k: usize,
            req: ForwardReq,
            /// What the last hop returns for this chunk.
            final_want: Want,
        }
        type Done = std::result::Result<(usize, Payload, Vec<HopTiming>), DistError>;
        let (final_tx, mut final_rx) = tokio::sync::mpsc::unbounded_channel::<(Done, Vec<HopTiming>)>();
        let mut inputs = Vec::new();
        let mut txs = Vec::new();
        for _ in 0..nh {
            let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<(Item, Vec<HopTiming>)>();
            txs.push(tx);
            inputs.push(rx);
        }
        let next_request = self.next_request.clone();
        let mut senders = Vec::new();
        // Hop i: sender writes requests in order; collector awaits replies in order and feeds hop i+1.
        for (i, mut rx) in inputs.into_iter().enumerate() {
            let (conn, info) = conns[i].clone();
            let next_tx = txs.get(i + 1).cloned();
            let final_tx = final_tx.clone();
            let (fifo_tx, mut fifo_rx) = tokio::sync::mpsc::unbounded_channel();
            let c2 = conn.clone();
            let ftx2 = final_tx.clone();
            senders.push(rt.spawn(async move {
                while let Some((item, timings)) = rx.recv().await {
                    match c2.call_async(&item.req.as_ref()).await {
                        Ok((reply, send)) => {
                            if fifo_tx.send((item, timings, reply, send, Instant::now())).is_err() {
                                break;
                            }
                        }
                        Err(m) => {
                            let _ = ftx2.send((Err(stage_error(&info, i + 1, ErrorKind::Failed, &m)), timings));
                            break;
                        }
                    }
                }
            }));
            let info = conns[i].1.clone();
            let nr = next_request.clone();
            senders.push(rt.spawn(async move {
                while let Some((item, mut timings, reply, send, t_sent)) = fifo_rx.recv().await {
                    let res = match reply.await {
                        Ok(Ok(r)) => r,
                        Ok(Err((kind, m))) => {
                            let _ = final_tx.send((Err(stage_error(&info, i + 1, kind, &m)), timings));
                            break;
                        }
                        Err(_) => {
                            let _ = final_tx.send((Err(stage_error(&info, i + 1, ErrorKind::Failed, "connection closed")), timings));
                            break;
                        }
                    };
                    let eval = Duration::from_micros(res.eval_us);
                    timings.push(HopTiming {
                        eval,
                        forward_send: send,
                        downstream_wait: t_sent.elapsed().saturating_sub(eval),
                        input_bytes: item.req.activations.len(),
                        output_bytes: crate::exec::payload_bytes(&res.payload),
                    });
                    match &next_tx {
                        None => {
                            // The chunk's activations are done with. The local stage's encode buffer goes
                            // back to the pool; a relayed one is a slice of a received frame, whose buffer
                            // the connection's reader takes back once it is dropped.
                            if i == 0 {
                                crate::wire::give_back(item.req.activations);
                            }
                            let _ = final_tx.send((Ok((item.k, res.payload, Vec::new())), timings));
                        }
                        Some(tx) => {
                            let Payload::Hidden { bits: b, data } = res.payload else {
                                let _ = final_tx.send((Err(stage_error(&info, i + 1, ErrorKind::Failed, "returned no hidden states")), timings));
                                break;
                            };
                            let mut req = item.req;
                            req.request = nr.fetch_add(1, Ordering::Relaxed);
                            req.bits = b;
                            let sent = std::mem::replace(&mut req.activations, data);
                            if i == 0 {
                                crate::wire::give_back(sent);
                            }
                            req.want = if i + 2 == nh { item.final_want } else { Want::Hidden };
                            if tx.send((Item { k: item.k, req, final_want: item.final_want }, timings)).is_err() {
                                break;
                            }
                        }
                    }
                }
            }));
        }
        drop(final_tx);
        let mut result: Result<()> = Ok(());
        let mut in_flight = 0usize;
        let mut done = 0usize;
        let mut local_time = Duration::ZERO;
        let pos0 = self.tokens.len();
        let chunk_pos: Vec<usize> = (0..n).map(|k| pos0 + k * chunk).collect();
        let mut hash = self.hash;
        let rid_base = self.request_id();
        let handle_done = |s: &mut Self, d: (Done, Vec<HopTiming>)| -> Result<()> {
            let (r, timings) = d;
            let (k, payload, _) = r?;
            for (h, t) in timings.iter().enumerate() {
                let info = &conns[h].1;
                s.record(rid_base, Some(h + 1), info.range.label(), info.location.clone(), chunk_pos[k], chunks[k].len(), Some((k, n)), *t);
            }
            if k + 1 == n {
                if let Payload::Logits(l) = payload {
                    s.logits = l;
                }
            }
            Ok(())
        };
        for (k, c) in chunks.iter().enumerate() {
            while in_flight >= window {
                match final_rx.blocking_recv() {
                    Some(d) => {
                        in_flight -= 1;
                        done += 1;
                        if let Err(e) = handle_done(self, d) {
                            result = Err(e);
                            break;
                        }
                    }
                    None => {
                        result = Err(DistError::Stage(ENDED_EARLY.into()));
                        break;
                    }
                }
            }
            if result.is_err() {
                break;
            }
            if cancel.load(Ordering::Relaxed) {
                result = Err(DistError::Other(CANCELLED.into()));
                break;
            }
            let pos = chunk_pos[k];
            let req = StageRequest { session: self.session, pos, prefix_hash: hash, tokens: c, input: None, want: Want::Hidden, bits };
            let t0 = Instant::now();
            let out = match self.local.forward(&req) {
                Ok(o) => o,
                Err(e) => {
                    result = Err(e);
                    break;
                }
            };
            local_time += t0.elapsed();
            let info = self.local.info();
            self.record(rid_base, None, info.range.label(), info.location, pos, c.len(), Some((k, n)), out.timing);
            let Payload::Hidden { bits: b, data } = out.payload else { unreachable!("local stage asked for hidden states") };
            let last = k + 1 == n;
            let final_want = if last { want } else { Want::Ack };
            let fr = ForwardReq {
                request: self.request_id(),
                session: self.session,
                pos: pos as u64,
                prefix_hash: hash,
                tokens: c.to_vec(),
                bits: b,
                activations: data,
                // Every hop but the last returns hidden states; the last acks non-final chunks.
                want: if nh == 1 { final_want } else { Want::Hidden },
            };
            hash = fnv1a_tokens(hash, c);
            if txs[0].send((Item { k, req: fr, final_want }, Vec::new())).is_err() {
                result = Err(DistError::Stage(ENDED_EARLY.into()));
                break;
            }
            in_flight += 1;
        }
        while result.is_ok() && done < n {
            match final_rx.blocking_recv() {
                Some(d) => {
                    done += 1;
                    if let Err(e) = handle_done(self, d) {
                        result = Err(e);
                    }
                }
                None => result = Err(DistError::Stage(ENDED_EARLY.into())),
            }
        }
        drop(txs);
        // A generic "ended early" hides the real cause, which is queued on the final channel.
        if matches!(&result, Err(DistError::Stage(m)) if m == ENDED_EARLY) {
            let deadline = Instant::now() + Duration::from_secs(1);
            while Instant::now() < deadline {
                match final_rx.try_recv() {
                    Ok((Err(e), _)) => {
                        result = Err(e);
                        break;
                    }
                    Ok(_) => {}
                    Err(tokio::sync::mpsc::error::TryRecvError::Disconnected) => break,
                    Err(tokio::sync::mpsc::error::TryRecvError::Empty) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        }
        for s in senders {
            s.abort();
        }
        result?;
        self.commit(toks);
        if self.opts.debug {
            let total = t_start.elapsed().as_secs_f64();
            eprintln!(
                "ds4: distributed coordinator: pipelined prefill done tokens={} chunks={n} total={total:.3}s {:.2} t/s local={:.3}s",
                toks.len(),
                toks.len() as f64 / total.max(1e-9),
                local_time.as_secs_f64()
            );
        }
        Ok(())
    }
}
