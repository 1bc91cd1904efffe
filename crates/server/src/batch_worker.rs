//! The batched scheduler (`--batched-session N`, N > 1): N resident KV sessions ("slots"), each with its
//! own live KV reuse (snapshots, disk cache). Every step decodes one token for every slot whose prompt
//! is in, as one batch (`Engine::decode_batch`: the weights are read once for all of them), and then
//! prefills one bounded slice (`--prefill-chunk` tokens; `--mixed-prefill-quantum` while others generate) of one slot still prefilling, so a long prompt
//! never freezes the other streams. A slot is never taken from a running request; a new request goes
//! to the idle slot whose KV serves the longest prefix of it (live state or snapshot), and with `--kv-disk-dir`
//! an idle slot holding another conversation is saved to disk before it is reused (`LiveKv::choose`).
use crate::errors::ApiError;
use crate::gen::{Gen, Report};
use crate::kv_reuse::{LiveKv, Prepared};
use crate::metrics::Metrics;
use crate::request_log::PrefillProgress;
use crate::tools::ToolMemory;
use crate::trace::Trace;
use crate::worker::{record_prefill, snapshot_points, Event, Job, Msg, WorkerConfig};
use ds4_engine::{Engine, Session, StopReason};
use ds4_model::residency;
use ds4_tokenizer::Tokenizer;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed, Ordering::SeqCst};
use std::sync::mpsc as std_mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

static JOB_SEQ: AtomicU64 = AtomicU64::new(1 << 32);

/// A request in a slot.
struct Running {
    gen: Gen,
    prep: Prepared,
    points: Vec<usize>,
    /// Prefill time so far (slices only), and whether the prompt is in.
    prefill_time: Duration,
    decoding: bool,
    plog: PrefillProgress,
    remaining: usize,
}

struct Slot {
    live: LiveKv,
    run: Option<Running>,
    last_used: u64,
}

struct Sched {
    engine: Engine,
    slots: Vec<Slot>,
    queue: VecDeque<Job>,
    tok: Arc<Tokenizer>,
    metrics: Arc<Metrics>,
    tool_mem: Arc<Mutex<ToolMemory>>,
    trace: Arc<Trace>,
    exact_tool_replay: bool,
    quiet: bool,
    prefill_chunk: usize,
    /// When the loaded steering applies (`--dir-steering-policy`).
    steer: crate::steer_policy::SteerPolicy,
    /// Sleeps after each scheduler turn's work (`--power`).
    power: ds4_engine::power::Power,
    /// Prefill slice while another session generates (`--mixed-prefill-quantum`).
    quantum: usize,
    clock: u64,
    /// Next slot to get a prefill slice (round robin among those prefilling).
    next_prefill: usize,
}

pub fn spawn(
    engine: Engine,
    rx: std_mpsc::Receiver<Msg>,
    tok: Arc<Tokenizer>,
    cfg: WorkerConfig,
    metrics: Arc<Metrics>,
    tool_mem: Arc<Mutex<ToolMemory>>,
    trace: Arc<Trace>,
) -> std::io::Result<()> {
    let chunk = cfg.prefill_chunk.max(1);
    let mut disk = cfg.disk;
    let slots = (0..cfg.batched)
        .map(|i| {
            let mut session = Session::new(&engine);
            session.prefill_chunk = chunk;
            // On a GPU backend scheduler slot i is device KV slot i (the CPU ignores it).
            session.kv.slot = i;
            let mut live = LiveKv::new(session, cfg.snapshots);
            // One disk cache, shared through the slot that holds it: every slot saves and restores
            // through `with_disk`.
            live.disk = None;
            Slot { live, run: None, last_used: 0 }
        })
        .collect::<Vec<_>>();
    metrics.batch_slots.store(cfg.batched as u64, Relaxed);
    let mut s = Sched {
        engine,
        slots,
        queue: VecDeque::new(),
        tok,
        metrics,
        tool_mem,
        trace,
        exact_tool_replay: cfg.exact_tool_replay,
        quiet: cfg.quiet,
        prefill_chunk: chunk,
        steer: cfg.steer,
        power: ds4_engine::power::Power::new(cfg.power).unwrap_or_else(|_| ds4_engine::power::Power::full()),
        quantum: cfg.quantum.max(1),
        clock: 0,
        next_prefill: 0,
    };
    std::thread::Builder::new().name("ds4-batch".into()).spawn(move || s.run(rx, &mut disk))?;
    Ok(())
}

impl Sched {
    fn busy(&self) -> bool {
        self.slots.iter().any(|s| s.run.is_some())
    }

    fn run(&mut self, rx: std_mpsc::Receiver<Msg>, disk: &mut Option<crate::disk::DiskCache>) {
        let mut acks: Vec<std_mpsc::Sender<()>> = Vec::new();
        loop {
            // Wait only when there is nothing to do.
            let first = if self.busy() || !self.queue.is_empty() {
                match rx.try_recv() {
                    Ok(m) => Some(m),
                    Err(std_mpsc::TryRecvError::Empty) => None,
                    Err(std_mpsc::TryRecvError::Disconnected) => return,
                }
            } else {
                match rx.recv() {
                    Ok(m) => Some(m),
                    Err(_) => return,
                }
            };
            for m in first.into_iter().chain(std::iter::from_fn(|| rx.try_recv().ok())) {
                match m {
                    Msg::Job(j) => self.queue.push_back(j),
                    Msg::Shutdown(ack) => acks.push(ack),
                }
            }
            // A turn (a prefill slice and a decode step) is the unit of work `--power` pays for.
            self.power.restart();
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                self.admit(disk);
                self.prefill_slice(disk);
                self.decode_step();
            }));
            if self.busy() {
                self.power.tick();
            }
            if r.is_err() {
                eprintln!("ds4-server: internal error (panic) in the batched scheduler; the sessions were reset");
                for slot in self.slots.iter_mut() {
                    if let Some(run) = slot.run.take() {
                        self.metrics.jobs_failed.fetch_add(1, Relaxed);
                        let _ = run.gen.job.events.send(Event::Error(ApiError::internal("internal error while generating")));
                    }
                    slot.live.reset(&self.engine);
                }
            }
            self.metrics.active_sessions.store(self.slots.iter().filter(|s| s.run.is_some()).count() as u64, Relaxed);
            self.metrics.busy.store(self.busy() as u64, SeqCst);
            if !acks.is_empty() && !self.busy() && self.queue.is_empty() {
                // Clean shutdown: every slot's session goes to the disk KV cache.
                for i in 0..self.slots.len() {
                    self.with_disk(i, disk, |live, engine, tok| live.save_to_disk(engine, tok, ds4_kvstore::Reason::Shutdown));
                }
                acks.drain(..).for_each(|a| {
                    let _ = a.send(());
                });
            }
        }
    }

    /// Runs `f` on slot `i`'s live KV with the shared disk cache attached.
    fn with_disk<R>(&mut self, i: usize, disk: &mut Option<crate::disk::DiskCache>, f: impl FnOnce(&mut LiveKv, &mut Engine, &Tokenizer) -> R) -> R {
        let live = &mut self.slots[i].live;
        live.disk = disk.take();
        let r = f(live, &mut self.engine, &self.tok);
        *disk = live.disk.take();
        r
    }

    /// Moves queued requests into idle slots: the one whose state serves the longest prefix of the
    /// prompt, else an empty one, else the least recently used.
    fn admit(&mut self, disk: &mut Option<crate::disk::DiskCache>) {
        while let Some(i) = self.best_idle_for_front() {
            let Some(job) = self.queue.pop_front() else { return };
            self.metrics.queue_depth.fetch_sub(1, SeqCst);
            if job.cancel.load(Relaxed) || job.events.is_closed() {
                self.metrics.jobs_cancelled.fetch_add(1, Relaxed);
                continue;
            }
            let ids = match self.tok.chat_ids() {
                Ok(i) => i,
                Err(e) => {
                    let _ = job.events.send(Event::Error(ApiError::internal(e.to_string())));
                    continue;
                }
            };
            let seq = JOB_SEQ.fetch_add(1, Relaxed);
            self.clock += 1;
            self.slots[i].last_used = self.clock;
            let points = snapshot_points(&job.prompt, ids.user);
            let t0 = Instant::now();
            let (prompt, rendered) = (job.prompt.clone(), job.rendered.clone());
            let prep = self.with_disk(i, disk, |live, engine, tok| live.choose(engine, tok, prompt, rendered.as_deref()));
            let prefill_time = t0.elapsed();
            let n_vocab = self.engine.cfg().n_vocab;
            let max_tokens = job.params.max_tokens.min(self.engine.ctx.saturating_sub(prep.prompt.len()));
            let plog = PrefillProgress::new(seq, job.kind, self.quiet);
            let gen = Gen::new(job, seq, self.tok.clone(), ids, self.tool_mem.clone(), self.exact_tool_replay, n_vocab);
            // Even with nothing left to prefill, the first `prefill_slice` turn runs `prefill_to` (it takes
            // the end-of-prompt snapshot) before the slot decodes.
            self.slots[i].run = Some(Running { gen, prep, points, prefill_time, decoding: false, plog, remaining: max_tokens });
        }
    }

    fn best_idle_for_front(&self) -> Option<usize> {
        let job = self.queue.front()?;
        self.slots
            .iter()
            .enumerate()
            .filter(|(_, s)| s.run.is_none())
            .max_by_key(|(_, s)| (s.live.reusable_prefix(&job.prompt), s.live.is_empty(), std::cmp::Reverse(s.last_used)))
            .map(|(i, _)| i)
    }

    /// One slice of the next slot still prefilling: `--prefill-chunk` tokens, or
    /// `--mixed-prefill-quantum` while another session generates.
    fn prefill_slice(&mut self, disk: &mut Option<crate::disk::DiskCache>) {
        let n = self.slots.len();
        let Some(i) = (0..n).map(|k| (self.next_prefill + k) % n).find(|&i| self.slots[i].run.as_ref().is_some_and(|r| !r.decoding)) else { return };
        self.next_prefill = (i + 1) % n;
        let mut run = self.slots[i].run.take().expect("running");
        // Beside sessions that generate, a prompt goes in small slices so their tokens keep coming.
        let generating = self.slots.iter().any(|s| s.run.as_ref().is_some_and(|r| r.decoding));
        let end = self.slots[i].live.session.tokens.len() + if generating { self.quantum } else { self.prefill_chunk };
        let t0 = Instant::now();
        let cancel = run.gen.job.cancel.clone();
        let ev = run.gen.job.events.clone();
        self.engine.set_steering_active(self.steer.prefill());
        let r = {
            let (prep, points, plog) = (&run.prep, &run.points, &mut run.plog);
            let mut progress = |d: usize, t: usize| {
                if ev.is_closed() {
                    cancel.store(true, SeqCst);
                }
                plog.update(d, t);
            };
            self.with_disk(i, disk, |live, engine, tok| live.prefill_to(engine, tok, prep, points, end, &mut progress, &cancel))
        };
        run.prefill_time += t0.elapsed();
        if let Err(e) = r {
            if cancel.load(Relaxed) {
                self.metrics.jobs_cancelled.fetch_add(1, Relaxed);
            } else {
                self.metrics.jobs_failed.fetch_add(1, Relaxed);
                eprintln!("ds4-server: request failed: prefill failed: {e}");
                let _ = run.gen.job.events.send(Event::Error(ApiError::internal(format!("prefill failed: {e}"))));
            }
            return;
        }
        self.slots[i].run = Some(run);
        self.finish_prefill_if_done(i);
    }

    /// When slot `i`'s prompt is in: the prefill is reported and the slot joins the decode batch.
    fn finish_prefill_if_done(&mut self, i: usize) {
        let slot = &mut self.slots[i];
        let Some(run) = slot.run.as_mut() else { return };
        if run.decoding || slot.live.session.tokens.len() < run.prep.prompt.len() {
            return;
        }
        run.decoding = true;
        record_prefill(&self.metrics, &run.prep, run.prefill_time);
        self.metrics.kv_snapshots_held.store(self.slots.iter().map(|s| s.live.snapshot_count() as u64).sum(), Relaxed);
        self.metrics.kv_snapshot_bytes.store(self.slots.iter().map(|s| s.live.snapshot_bytes() as u64).sum(), Relaxed);
        let run = self.slots[i].run.as_ref().expect("running");
        let _ = run.gen.job.events.send(Event::Started { prompt_tokens: run.prep.prompt.len(), cached_tokens: run.prep.cached });
    }

    fn end(&mut self, i: usize, r: Result<StopReason, ApiError>) {
        let Some(run) = self.slots[i].run.take() else { return };
        if r.is_err() {
            self.slots[i].live.reset(&self.engine);
        }
        let rep = Report { metrics: &self.metrics, trace: &self.trace, quiet: self.quiet };
        run.gen.finish(r, &rep, &run.prep, run.prefill_time);
    }

    /// Samples the next token of every decoding slot, ends those that stop, and feeds the rest their
    /// token in one batched step (the same order of checks as `Session::generate`).
    fn decode_step(&mut self) {
        let eos = self.tok.chat_ids().ok().map(|i| i.eos);
        let ctx = self.engine.ctx;
        let mut feed: Vec<(usize, u32)> = Vec::new();
        for i in 0..self.slots.len() {
            let slot = &mut self.slots[i];
            let Some(run) = slot.run.as_mut().filter(|r| r.decoding) else { continue };
            let t0 = Instant::now();
            let stop = if run.remaining == 0 {
                Some(Ok(StopReason::MaxTokens))
            } else if run.gen.cancelled() {
                Some(Ok(StopReason::Cancelled))
            } else if slot.live.session.logits.is_empty() {
                Some(Err(ApiError::internal("generation failed: nothing to continue from: empty prompt")))
            } else {
                let t = run.gen.sample(&slot.live.session.logits);
                run.gen.stats.gen_tokens += 1;
                if Some(t) == eos {
                    Some(Ok(StopReason::Eos))
                } else if !run.gen.on_token(t) {
                    Some(Ok(StopReason::Caller))
                } else if slot.live.session.tokens.len() >= ctx {
                    Some(Ok(StopReason::ContextFull))
                } else {
                    run.remaining -= 1;
                    feed.push((i, t));
                    None
                }
            };
            run.gen.stats.gen_time += t0.elapsed();
            if let Some(r) = stop {
                self.end(i, r);
            }
        }
        if feed.is_empty() {
            return;
        }
        residency::set_phase(residency::Phase::Decode);
        let t0 = Instant::now();
        let toks: Vec<u32> = feed.iter().map(|f| f.1).collect();
        // Each session's row is steered as its own request's phase (`--dir-steering-policy`).
        let steer: Vec<bool> = feed.iter().map(|f| self.slots[f.0].run.as_ref().is_some_and(|r| self.steer.decode(r.gen.in_reasoning()))).collect();
        let mut kvs: Vec<&mut ds4_model::KvState> = Vec::with_capacity(feed.len());
        let mut it = feed.iter().peekable();
        for (i, slot) in self.slots.iter_mut().enumerate() {
            if it.peek().is_some_and(|f| f.0 == i) {
                it.next();
                kvs.push(&mut slot.live.session.kv);
            }
        }
        self.engine.set_steering_active(true);
        self.engine.set_steering_rows(&steer);
        let r = self.engine.decode_batch(&mut kvs, &toks).map(|l| l.to_vec());
        self.engine.set_steering_rows(&[]);
        drop(kvs);
        let dt = t0.elapsed();
        self.metrics.batch_last_size.store(feed.len() as u64, Relaxed);
        self.metrics.batch_steps.fetch_add(1, Relaxed);
        self.metrics.batch_rows.fetch_add(feed.len() as u64, Relaxed);
        match r {
            Ok(rows) => {
                let v = rows.len() / feed.len();
                for (j, &(i, t)) in feed.iter().enumerate() {
                    let slot = &mut self.slots[i];
                    let s = &mut slot.live.session;
                    s.tokens.push(t);
                    s.logits.clear();
                    s.logits.extend_from_slice(&rows[j * v..(j + 1) * v]);
                    if let Some(run) = slot.run.as_mut() {
                        run.gen.stats.gen_time += dt;
                    }
                }
            }
            Err(e) => {
                for &(i, _) in &feed {
                    self.end(i, Err(ApiError::internal(format!("generation failed: {e}"))));
                }
            }
        }
    }
}
