//! The single inference thread. Requests are parsed and tokenized by the HTTP tasks, then queued here
//! (bounded admission: `--max-queue`); the worker owns the engine and the one live session, runs prefill
//! with KV reuse, samples, detokenizes, recognises DSML tool calls, and sends events back over a
//! per-request channel. A request whose client has gone away (its event receiver dropped, or its cancel
//! flag set by a drop guard) is skipped while queued and stopped within one token while running.
use crate::errors::ApiError;
use crate::kv_reuse::{Decision, LiveKv};
use crate::metrics::Metrics;
use crate::route_kv::RouteKv;
use crate::tools::{new_id, ToolMemory};
use crate::trace::Trace;
use ds4_engine::{Engine, GenStats};
use ds4_tokenizer::dsml::{DsmlEvent, DsmlParser};
use ds4_tokenizer::sampling::SamplerConfig;
use ds4_tokenizer::Tokenizer;
use crate::gen::{Gen, Report};
use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed, Ordering::SeqCst};
use std::sync::mpsc as std_mpsc;
use std::sync::{Arc, Mutex};
use std::time::Instant;
use tokio::sync::mpsc;

/// What a request asks of the worker.
#[derive(Debug, Clone)]
pub struct GenParams {
    pub max_tokens: usize,
    pub sampling: SamplerConfig,
    pub stops: Vec<String>,
    /// The prompt ends with `<think>`: output starts as reasoning.
    pub thinking: bool,
    /// Recognise DSML tool calls in the output (chat-style endpoints); off (also for `tool_choice`
    /// none), a tool-call block the model writes anyway is text.
    pub parse_tools: bool,
    /// Tool-call id prefix (`call_` / `toolu_`).
    pub id_prefix: &'static str,
    /// Test-only scripted output (`--test-script`): these tokens are emitted instead of sampled ones.
    pub script: Option<Vec<u32>>,
    /// Per-token logprobs with this many alternatives (None: off, no extra work per token).
    pub logprobs: Option<usize>,
    /// A forced tool choice: the prompt ends in the opening of its call, the output is its rest.
    pub forced: Option<crate::tool_choice::Forced>,
    /// At most one tool call (`parallel_tool_calls: false`, `disable_parallel_tool_use`): the block
    /// ends after the first.
    pub single_call: bool,
}

pub struct Job {
    pub kind: &'static str,
    pub prompt: Vec<u32>,
    pub rendered: Option<String>,
    pub params: GenParams,
    pub events: mpsc::UnboundedSender<Event>,
    pub cancel: Arc<AtomicBool>,
    /// When the request was queued (time to first token counts from here).
    pub queued: Instant,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finish {
    Stop,
    Length,
    ToolCalls,
    /// A stop string matched (its index in the request's list).
    StopSequence(usize),
}

#[derive(Debug, Clone, Copy, Default)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub cached_tokens: usize,
    pub completion_tokens: usize,
    /// Generated tokens of the reasoning (up to and including `</think>`).
    pub reasoning_tokens: usize,
}

#[derive(Debug, Clone)]
pub enum Event {
    /// Prefill done, generation starts.
    Started { prompt_tokens: usize, cached_tokens: usize },
    Reasoning(String),
    Text(String),
    /// Logprobs of one visible output token (only when the request asked for them); sent just before
    /// the `Text` that shows the token's text (at the end when its text never shows, e.g. a stop string).
    Logprob(crate::logprobs::TokenLogprob),
    /// A tool-call block began (the text before it is complete); the call itself comes whole in
    /// `ToolDone`, or never when the block is cut short (it then ends as text).
    ToolStart,
    ToolDone { index: usize, id: String, name: String, arguments: String },
    Done { finish: Finish, usage: Usage },
    Error(ApiError),
}

/// What the worker's queue carries.
pub(crate) enum Msg {
    Job(Job),
    /// Save the live session to the disk KV cache (clean shutdown), then acknowledge.
    Shutdown(std_mpsc::Sender<()>),
}

/// The HTTP side's handle on the queue.
pub struct Submitter {
    tx: Mutex<std_mpsc::Sender<Msg>>,
    max_queue: usize,
    metrics: Arc<Metrics>,
}

/// Sets the cancel flag when dropped (held by whatever consumes a job's events).
pub struct CancelOnDrop(pub Arc<AtomicBool>);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        self.0.store(true, SeqCst);
    }
}

impl Submitter {
    /// Queues a job; 503 when `--max-queue` jobs are already waiting or the worker is gone.
    pub fn submit(
        &self,
        kind: &'static str,
        prompt: Vec<u32>,
        rendered: Option<String>,
        params: GenParams,
    ) -> Result<(mpsc::UnboundedReceiver<Event>, CancelOnDrop), ApiError> {
        let depth = self.metrics.queue_depth.fetch_add(1, SeqCst);
        if self.max_queue > 0 && depth >= self.max_queue as u64 {
            self.metrics.queue_depth.fetch_sub(1, SeqCst);
            self.metrics.queue_rejected.fetch_add(1, Relaxed);
            return Err(ApiError::too_many(format!("server busy: {depth} requests already queued (--max-queue)")).code("queue_full"));
        }
        let (etx, erx) = mpsc::unbounded_channel();
        let cancel = Arc::new(AtomicBool::new(false));
        let job = Job { kind, prompt, rendered, params, events: etx, cancel: cancel.clone(), queued: Instant::now() };
        let sent = self.tx.lock().map_err(|_| ApiError::internal("queue lock poisoned"))?.send(Msg::Job(job));
        if sent.is_err() {
            self.metrics.queue_depth.fetch_sub(1, SeqCst);
            return Err(ApiError::unavailable("the inference worker is not running"));
        }
        Ok((erx, CancelOnDrop(cancel)))
    }

    /// Asks the worker to save the live session to the disk KV cache once the jobs queued before this
    /// call are done; waits at most `timeout`. False when it did not confirm in time.
    pub fn shutdown(&self, timeout: std::time::Duration) -> bool {
        let (atx, arx) = std_mpsc::channel();
        let Ok(tx) = self.tx.lock() else { return false };
        if tx.send(Msg::Shutdown(atx)).is_err() {
            return false;
        }
        drop(tx);
        arx.recv_timeout(timeout).is_ok()
    }
}

pub struct WorkerConfig {
    pub snapshots: usize,
    pub prefill_chunk: usize,
    pub exact_tool_replay: bool,
    pub disk: Option<crate::disk::DiskCache>,
    /// No per-request log lines (`--quiet`).
    pub quiet: bool,
    /// KV sessions decoded together (`--batched-session`); 1 = one request at a time.
    pub batched: usize,
    /// When the loaded steering applies (`--dir-steering-policy`).
    pub steer: crate::steer_policy::SteerPolicy,
    /// Duty-cycle target in percent (`--power`; 100: no sleeps).
    pub power: u32,
    /// Prefill slice while other sessions generate (`--mixed-prefill-quantum`, batched sessions).
    pub quantum: usize,
}

/// What runs the model: a local engine, or a distributed route (`--role coordinator`).
pub enum Model {
    Local(Engine),
    Route(RouteKv),
}

enum Backend {
    /// The engine with live KV reuse (snapshots, disk cache).
    Local { engine: Engine, live: LiveKv },
    Route(RouteKv),
}

impl Backend {
    fn reset(&mut self) {
        match self {
            Backend::Local { engine, live } => live.reset(engine),
            Backend::Route(r) => r.reset(),
        }
    }
}

/// Starts the worker thread; returns the submit handle.
pub fn spawn(
    model: Model,
    tok: Arc<Tokenizer>,
    cfg: WorkerConfig,
    max_queue: usize,
    metrics: Arc<Metrics>,
    tool_mem: Arc<Mutex<ToolMemory>>,
    trace: Arc<Trace>,
) -> std::io::Result<Submitter> {
    let (tx, rx) = std_mpsc::channel::<Msg>();
    let model = match model {
        Model::Local(engine) if cfg.batched > 1 => {
            crate::batch_worker::spawn(engine, rx, tok, cfg, metrics.clone(), tool_mem, trace)?;
            return Ok(Submitter { tx: Mutex::new(tx), max_queue, metrics });
        }
        m => m,
    };
    let backend = match model {
        Model::Local(engine) => {
            let mut session = ds4_engine::Session::new(&engine);
            session.prefill_chunk = cfg.prefill_chunk.max(1);
            let mut live = LiveKv::new(session, cfg.snapshots);
            live.disk = cfg.disk;
            Backend::Local { engine, live }
        }
        Model::Route(r) => Backend::Route(r),
    };
    let mut w = Worker { backend, tok, metrics: metrics.clone(), tool_mem, trace, exact_tool_replay: cfg.exact_tool_replay, quiet: cfg.quiet, steer: cfg.steer, power: ds4_engine::power::Power::new(cfg.power).unwrap_or_else(|_| ds4_engine::power::Power::full()) };
    std::thread::Builder::new().name("ds4-worker".into()).spawn(move || {
        while let Ok(msg) = rx.recv() {
            let job = match msg {
                Msg::Job(job) => job,
                Msg::Shutdown(ack) => {
                    let tok = w.tok.clone();
                    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        if let Backend::Local { live, engine } = &mut w.backend {
                            live.save_to_disk(engine, &tok, ds4_kvstore::Reason::Shutdown)
                        }
                    }));
                    if r.is_err() {
                        eprintln!("ds4-server: internal error (panic) while saving the session at shutdown");
                    }
                    let _ = ack.send(());
                    continue;
                }
            };
            w.metrics.queue_depth.fetch_sub(1, SeqCst);
            w.metrics.busy.store(1, SeqCst);
            let events = job.events.clone();
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| w.run(job)));
            if r.is_err() {
                eprintln!("ds4-server: internal error (panic) while running a request; live KV state reset");
                w.metrics.jobs_failed.fetch_add(1, Relaxed);
                w.backend.reset();
                let _ = events.send(Event::Error(ApiError::internal("internal error while generating")));
            }
            w.metrics.busy.store(0, SeqCst);
        }
    })?;
    Ok(Submitter { tx: Mutex::new(tx), max_queue, metrics })
}

struct Worker {
    backend: Backend,
    tok: Arc<Tokenizer>,
    metrics: Arc<Metrics>,
    tool_mem: Arc<Mutex<ToolMemory>>,
    trace: Arc<Trace>,
    exact_tool_replay: bool,
    quiet: bool,
    steer: crate::steer_policy::SteerPolicy,
    /// Sleeps after each prefill chunk and decoded token (`--power`).
    power: ds4_engine::power::Power,
}

static JOB_SEQ: AtomicU64 = AtomicU64::new(0);

impl Worker {
    fn gone(job: &Job) -> bool {
        job.cancel.load(Relaxed) || job.events.is_closed()
    }

    fn run(&mut self, job: Job) {
        let seq = JOB_SEQ.fetch_add(1, Relaxed) + 1;
        if Self::gone(&job) {
            self.metrics.jobs_cancelled.fetch_add(1, Relaxed);
            return;
        }
        let tok = self.tok.clone();
        let ids = match tok.chat_ids() {
            Ok(i) => i,
            Err(e) => {
                let _ = job.events.send(Event::Error(ApiError::internal(e.to_string())));
                return;
            }
        };
        let points = snapshot_points(&job.prompt, ids.user);
        let t0 = Instant::now();
        let cancel = job.cancel.clone();
        let ev = job.events.clone();
        let mut plog = crate::request_log::PrefillProgress::new(seq, job.kind, self.quiet);
        let power = &mut self.power;
        power.restart();
        let mut progress = |d: usize, t: usize| {
            if ev.is_closed() {
                cancel.store(true, SeqCst);
            }
            plog.update(d, t);
            power.tick();
        };
        let prep = match &mut self.backend {
            Backend::Local { engine, live } => {
                engine.set_steering_active(self.steer.prefill());
                let p = live.prepare(engine, &tok, job.prompt.clone(), job.rendered.as_deref(), &points, &mut progress, &job.cancel);
                self.metrics.kv_snapshots_held.store(live.snapshot_count() as u64, Relaxed);
                self.metrics.kv_snapshot_bytes.store(live.snapshot_bytes() as u64, Relaxed);
                p.map_err(|e| ApiError::internal(format!("prefill failed: {e}")))
            }
            Backend::Route(r) => r.prepare(job.prompt.clone(), &job.cancel),
        };
        let prefill_time = t0.elapsed();
        let prep = match prep {
            Ok(p) => p,
            Err(e) => {
                if job.cancel.load(Relaxed) {
                    self.metrics.jobs_cancelled.fetch_add(1, Relaxed);
                } else {
                    self.metrics.jobs_failed.fetch_add(1, Relaxed);
                    eprintln!("ds4-server: request failed: {}", e.message);
                    let _ = job.events.send(Event::Error(e));
                }
                return;
            }
        };
        record_prefill(&self.metrics, &prep, prefill_time);
        let _ = job.events.send(Event::Started { prompt_tokens: prep.prompt.len(), cached_tokens: prep.cached });

        // Generation.
        let (ctx, n_vocab) = match &self.backend {
            Backend::Local { engine, .. } => (engine.ctx, engine.cfg().n_vocab),
            Backend::Route(r) => (r.ctx(), r.n_vocab),
        };
        let max_tokens = job.params.max_tokens.min(ctx.saturating_sub(prep.prompt.len()));
        let cancel = job.cancel.clone();
        let g = RefCell::new(Gen::new(job, seq, tok, ids, self.tool_mem.clone(), self.exact_tool_replay, n_vocab));
        let greedy = g.borrow().greedy;
        let mut sample = |l: &[f32]| g.borrow_mut().sample(l);
        // The steering of the step that feeds `t` follows the request's phase after it.
        let policy = self.steer;
        let gate = match &self.backend {
            Backend::Local { engine, .. } => Some(engine.steering_gate()),
            Backend::Route(_) => None,
        };
        let power = &mut self.power;
        power.restart();
        let mut on_token = |t: u32| {
            // The decode step that produced `t` is the unit of work paid for here.
            power.tick();
            let more = g.borrow_mut().on_token(t);
            if let Some(gate) = &gate {
                gate.store(policy.decode(g.borrow().in_reasoning()), Relaxed);
            }
            more
        };
        let mut stats = GenStats::default();
        let eos = Some(ids.eos);
        // Under `final-answer` steering starts after the reasoning's end, which a verify step of
        // several drafted rows could hold: such a request decodes without drafts.
        let steered = matches!(&self.backend, Backend::Local { engine, .. } if engine.steering().is_some());
        let speculate = g.borrow().speculable() && !(steered && self.steer == crate::steer_policy::SteerPolicy::FinalAnswer && g.borrow().in_reasoning());
        let r = match &mut self.backend {
            Backend::Local { engine, live } if speculate && live.session.speculative() => {
                let mut s = SpecGen(&g);
                live.session
                    .generate_speculative(engine, max_tokens, eos, &mut s, &mut on_token, &cancel, &mut stats)
                    .map_err(|e| ApiError::internal(format!("generation failed: {e}")))
            }
            Backend::Local { engine, live } => live
                .session
                .generate(engine, max_tokens, eos, greedy, &mut sample, &mut on_token, &cancel, &mut stats)
                .map_err(|e| ApiError::internal(format!("generation failed: {e}"))),
            // A failed route keeps its history: the next request that extends it replays it.
            Backend::Route(r) => r.generate(max_tokens, eos, greedy, &mut sample, &mut on_token, &cancel, &mut stats),
        };
        if r.is_err() {
            if let Backend::Local { .. } = self.backend {
                self.backend.reset();
            }
        }
        let mut g = g.into_inner();
        g.stats = stats;
        g.finish(r, &Report { metrics: &self.metrics, trace: &self.trace, quiet: self.quiet }, &prep, prefill_time);
    }
}

/// A request's sampler as MTP speculative decoding uses it (`Gen` keeps the sampling state).
struct SpecGen<'a>(&'a RefCell<Gen>);

impl ds4_engine::SpecSampler for SpecGen<'_> {
    fn pick(&mut self, l: &[f32]) -> u32 { self.0.borrow_mut().sample(l) }
    fn target(&mut self, l: &[f32], out: &mut Vec<(u32, f32)>) { self.0.borrow_mut().target(l, out) }
    fn proposal(&mut self, l: &[f32], out: &mut Vec<(u32, f32)>) { self.0.borrow_mut().proposal(l, out) }
    fn uniform(&mut self) -> f64 { self.0.borrow_mut().uniform() }
    // The request's greedy (no logprobs, no script): the argmax everywhere, tool-call syntax included.
    fn greedy(&self) -> bool { self.0.borrow().greedy }
}

/// Snapshot points of a prompt: the start of its first and of its last user turn.
pub(crate) fn snapshot_points(prompt: &[u32], user: u32) -> Vec<usize> {
    let mut points = Vec::new();
    if let Some(p) = prompt.iter().position(|&t| t == user) {
        points.push(p);
    }
    if let Some(p) = prompt.iter().rposition(|&t| t == user) {
        points.push(p);
    }
    points
}

/// Prefill counters and the KV reuse decision of a prepared prompt.
pub(crate) fn record_prefill(m: &Metrics, prep: &crate::kv_reuse::Prepared, prefill_time: std::time::Duration) {
    m.prompt_tokens.fetch_add(prep.prompt.len() as u64, Relaxed);
    m.cached_tokens.fetch_add(prep.cached as u64, Relaxed);
    m.prefilled_tokens.fetch_add(prep.prefilled as u64, Relaxed);
    m.prefill_micros.fetch_add(prefill_time.as_micros() as u64, Relaxed);
    if prep.prefilled > 0 && prefill_time.as_secs_f64() > 0.0 {
        m.last_prefill_mtps.store((prep.prefilled as f64 / prefill_time.as_secs_f64() * 1000.0) as u64, Relaxed);
    }
    match prep.decision {
        Decision::Cold => {
            m.kv_misses.fetch_add(1, Relaxed);
            if prep.live_len > 0 {
                eprintln!(
                    "ds4-server: live kv cache miss live={} prompt={} common={} reason=token-mismatch",
                    prep.live_len,
                    prep.prompt.len(),
                    prep.live_common
                );
            }
        }
        d => {
            m.kv_hits.fetch_add(1, Relaxed);
            match d {
                Decision::Extend => &m.kv_extend,
                Decision::Exact => &m.kv_exact,
                Decision::TextPrefix => &m.kv_text_prefix,
                Decision::Disk => &m.kv_disk,
                _ => &m.kv_snapshot,
            }
            .fetch_add(1, Relaxed);
        }
    }
}

/// Turns decoded text into events: reasoning/text/tool calls (DSML), holding back trailing whitespace
/// of visible text until it is known not to precede a tool-call block (that whitespace belongs to the
/// block's exact DSML, so streamed and final content agree and history replays byte-exact).
pub(crate) struct Output {
    events: mpsc::UnboundedSender<Event>,
    parser: Option<DsmlParser>,
    id_prefix: &'static str,
    /// All text after stop handling (what the model said).
    pub(crate) all_text: String,
    pending_ws: String,
    block_start: Option<usize>,
    block_ids: Vec<String>,
    pub(crate) calls: Vec<(String, String)>,
    pub(crate) block_done: bool,
    tool_mem: Arc<Mutex<ToolMemory>>,
    remember: bool,
    /// Logprobs of tokens whose text has not been sent yet: sent just before it, dropped when that
    /// text turns out to open a tool-call block.
    pub(crate) lp_pending: Vec<crate::logprobs::TokenLogprob>,
    forced: Option<crate::tool_choice::Forced>,
    single_call: bool,
    /// The tool-call block was ended by the end of the output (token limit, stop string, end of
    /// sequence), not by the model closing it: its calls are what parsed of it (a forced call made up,
    /// or the calls finished before the cut).
    pub(crate) cut_short: bool,
    /// No tool calls (`parse_tools` off): a block is held until it ends, then sent as text.
    calls_off: bool,
}

const CALLS_OPEN: &str = "<｜DSML｜tool_calls>";
const CALLS_CLOSE: &str = "</｜DSML｜tool_calls>";
const INVOKE_CLOSE: &str = "</｜DSML｜invoke>";

impl Output {
    pub(crate) fn new(job: &Job, tool_mem: Arc<Mutex<ToolMemory>>, remember: bool) -> Self {
        let p = &job.params;
        Self {
            events: job.events.clone(),
            parser: if p.parse_tools || p.thinking { Some(DsmlParser::new(p.thinking)) } else { None },
            id_prefix: p.id_prefix,
            all_text: String::new(),
            pending_ws: String::new(),
            block_start: None,
            block_ids: Vec::new(),
            calls: Vec::new(),
            block_done: false,
            tool_mem,
            remember,
            lp_pending: Vec::new(),
            forced: None,
            single_call: p.single_call,
            cut_short: false,
            calls_off: !p.parse_tools,
        }
        .with_forced(p.forced.clone())
    }

    /// A forced call's opening is in the prompt: the parser reads it as if it had been generated (the
    /// block starts at the output's start; an `invoke` header in it gets its call id), nothing is sent.
    fn with_forced(mut self, forced: Option<crate::tool_choice::Forced>) -> Self {
        let Some(f) = forced else { return self };
        let parser = self.parser.get_or_insert_with(|| DsmlParser::new(false));
        for e in parser.push(&f.prefix) {
            if let DsmlEvent::ToolCallStart { .. } = e {
                self.block_ids.push(new_id(self.id_prefix));
            }
        }
        self.all_text.push_str(&f.prefix);
        self.block_start = Some(0);
        self.forced = Some(f);
        self
    }

    /// Ends a forced block that holds no finished call with the call made up from what parses of it.
    fn salvage_forced(&mut self) {
        let (Some(f), Some(start)) = (self.forced.as_ref(), self.block_start) else { return };
        if !self.calls.is_empty() {
            self.block_done = true;
            return;
        }
        let (name, arguments) = crate::forced_call::forced_call(f, &self.all_text[start..]);
        eprintln!("ds4-server: forced tool call `{name}` made up from unparsable output");
        let id = self.block_ids.first().cloned().unwrap_or_else(|| new_id(self.id_prefix));
        self.calls.push((id.clone(), name.clone()));
        let _ = self.events.send(Event::ToolDone { index: 0, id, name, arguments });
        self.lp_pending.clear();
        self.block_done = true;
    }

    fn send_logprobs(&mut self) {
        for l in self.lp_pending.drain(..) {
            let _ = self.events.send(Event::Logprob(l));
        }
    }

    /// Inside a tool-call block (its opening marker seen, or a call started).
    pub(crate) fn in_tool_block(&self) -> bool {
        self.forced.is_some() || self.block_start.is_some() || self.parser.as_ref().is_some_and(|p| p.in_tool_block())
    }

    pub(crate) fn in_syntax(&self) -> bool {
        self.parser.as_ref().is_some_and(|p| p.in_syntax())
    }

    pub(crate) fn push(&mut self, text: &str) {
        if text.is_empty() || self.block_done {
            return;
        }
        self.all_text.push_str(text);
        let Some(parser) = self.parser.as_mut() else {
            self.send_logprobs();
            let _ = self.events.send(Event::Text(text.to_string()));
            return;
        };
        let evs = parser.push(text);
        self.handle(evs);
    }

    fn text(&mut self, s: &str) {
        let trimmed = s.trim_end();
        if trimmed.is_empty() {
            self.pending_ws.push_str(s);
            return;
        }
        let mut emit = std::mem::take(&mut self.pending_ws);
        emit.push_str(trimmed);
        self.pending_ws.push_str(&s[trimmed.len()..]);
        self.send_logprobs();
        let _ = self.events.send(Event::Text(emit));
    }

    fn handle(&mut self, evs: Vec<DsmlEvent>) {
        for e in evs {
            if self.block_done {
                break;
            }
            match e {
                DsmlEvent::Reasoning(r) => {
                    let _ = self.events.send(Event::Reasoning(r));
                }
                // Text before any call: a forced block was closed without one.
                DsmlEvent::Text(_) if self.forced.is_some() && self.calls.is_empty() => self.salvage_forced(),
                DsmlEvent::Text(t) => {
                    // Text after a block of a request without tool calls: the block (closed) first.
                    self.block_as_text();
                    self.text(&t)
                }
                DsmlEvent::ToolCallStart { .. } => {
                    if self.block_start.is_none() {
                        let at = self.all_text.rfind(CALLS_OPEN).unwrap_or(self.all_text.len());
                        // Whitespace right before the marker was never shown (held back, or swallowed by
                        // the parser): it belongs to the block's exact DSML.
                        let start = self.all_text[..at].trim_end().len();
                        self.block_start = Some(start);
                        self.pending_ws.clear();
                        self.lp_pending.clear();
                    }
                    if self.calls_off {
                        continue;
                    }
                    self.block_ids.push(new_id(self.id_prefix));
                    let _ = self.events.send(Event::ToolStart);
                }
                DsmlEvent::ToolCallDone { .. } if self.calls_off || (self.single_call && !self.calls.is_empty()) => {}
                DsmlEvent::ToolCallDone { name, arguments_json } => {
                    let index = self.calls.len();
                    let id = self.block_ids.get(index).cloned().unwrap_or_else(|| new_id(self.id_prefix));
                    self.calls.push((id.clone(), name.clone()));
                    let _ = self.events.send(Event::ToolDone { index, id, name, arguments: arguments_json });
                }
                DsmlEvent::Malformed { reason, .. } if self.forced.is_some() => {
                    eprintln!("ds4-server: malformed DSML in a forced tool call ({reason})");
                    self.salvage_forced();
                }
                DsmlEvent::Malformed { raw, reason } => {
                    eprintln!("ds4-server: malformed DSML tool call ({reason}); returned as text");
                    // With the whitespace before the block, which was held back when it opened.
                    let raw = match self.block_start.take() {
                        Some(start) if self.all_text[start..].ends_with(&raw) => self.all_text[start..].to_string(),
                        _ => raw,
                    };
                    self.block_ids.truncate(self.calls.len());
                    self.text(&raw);
                }
            }
        }
        if self.block_done {
            return;
        }
        self.block_as_text();
        // The block is complete once the parser has left it with at least one finished call (or after
        // the first call when only one is allowed).
        if let (Some(start), Some(p)) = (self.block_start, self.parser.as_ref()) {
            if !p.in_tool_block() && !self.calls.is_empty() {
                let end = self.block_end(start, CALLS_CLOSE);
                self.remember_block(&self.all_text[start..end]);
                self.block_done = true;
            } else if self.single_call && !self.calls.is_empty() {
                // Cut after its first call, and closed as the model would, so the history replays it.
                let end = self.block_end(start, INVOKE_CLOSE);
                self.remember_block(&format!("{}\n{CALLS_CLOSE}", &self.all_text[start..end]));
                self.block_done = true;
            } else if self.forced.is_some() && !p.in_tool_block() {
                // A forced block closed without a call.
                self.salvage_forced();
            }
        }
    }

    /// Without tool calls, a block the parser has left (closed) is sent as the text it is.
    fn block_as_text(&mut self) {
        let (true, Some(start)) = (self.calls_off, self.block_start) else { return };
        if self.parser.as_ref().is_some_and(|p| p.in_tool_block()) {
            return;
        }
        let end = self.block_end(start, CALLS_CLOSE);
        let raw = self.all_text[start..end].to_string();
        self.block_start = None;
        self.text(&raw);
    }

    /// End of the block starting at `start`: just past its first `marker`, else the output so far.
    fn block_end(&self, start: usize, marker: &str) -> usize {
        self.all_text[start..].find(marker).map_or(self.all_text.len(), |i| start + i + marker.len())
    }

    fn remember_block(&self, raw: &str) {
        if self.remember {
            if let Ok(mut mem) = self.tool_mem.lock() {
                let ids: Vec<String> = self.calls.iter().map(|c| c.0.clone()).collect();
                mem.insert(&ids, raw);
            }
        }
    }

    pub(crate) fn finish(&mut self) {
        if self.block_done {
            return;
        }
        if let Some(p) = self.parser.as_mut() {
            let evs = p.finish();
            self.handle(evs);
        }
        self.cut_short = self.block_done;
        if !self.pending_ws.is_empty() && !self.block_done {
            let ws = std::mem::take(&mut self.pending_ws);
            self.send_logprobs();
            let _ = self.events.send(Event::Text(ws));
        }
        // Tokens whose text never showed (a stop string cut it) still came from the model.
        if !self.in_tool_block() {
            self.send_logprobs();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tool_choice::ToolChoice;
    use serde_json::json;

    fn job(forced: Option<crate::tool_choice::Forced>, single_call: bool) -> (Job, mpsc::UnboundedReceiver<Event>) {
        let (events, rx) = mpsc::unbounded_channel();
        let params = GenParams { max_tokens: 16, sampling: SamplerConfig::default(), stops: Vec::new(), thinking: false, parse_tools: true, id_prefix: "call_", script: None, logprobs: None, forced, single_call };
        (Job { kind: "chat", prompt: Vec::new(), rendered: None, params, events, cancel: Arc::new(AtomicBool::new(false)), queued: Instant::now() }, rx)
    }

    fn forced(choice: ToolChoice) -> Option<crate::tool_choice::Forced> {
        let schemas = vec![json!({"name": "get_weather"}).to_string(), json!({"name": "search"}).to_string()];
        choice.forced(&schemas).unwrap()
    }

    /// Runs `pieces` through an `Output`; returns (text, calls as (name, arguments)), block done.
    fn run(forced: Option<crate::tool_choice::Forced>, single_call: bool, pieces: &[&str]) -> (String, Vec<(String, String)>, bool) {
        let (t, c, done, _) = run_cut(forced, single_call, pieces);
        (t, c, done)
    }

    /// As `run`, also whether the end of the output cut the block short.
    fn run_cut(forced: Option<crate::tool_choice::Forced>, single_call: bool, pieces: &[&str]) -> (String, Vec<(String, String)>, bool, bool) {
        let (j, mut rx) = job(forced, single_call);
        let mut out = Output::new(&j, Arc::new(Mutex::new(ToolMemory::new(8))), true);
        for p in pieces {
            out.push(p);
        }
        out.finish();
        let cut = out.cut_short;
        let (mut text, mut calls) = (String::new(), Vec::new());
        while let Ok(e) = rx.try_recv() {
            match e {
                Event::Text(s) => text.push_str(&s),
                Event::ToolDone { name, arguments, .. } => calls.push((name, arguments)),
                _ => {}
            }
        }
        (text, calls, out.block_done, cut)
    }

    const D: &str = "｜DSML｜";

    #[test]
    fn a_forced_call_is_parsed_from_the_continuation_of_its_opening() {
        let cont = format!("<{D}parameter name=\"city\" string=\"true\">Paris</{D}parameter>\n</{D}invoke>\n</{D}tool_calls>");
        let (text, calls, done) = run(forced(ToolChoice::Named("get_weather".into())), false, &[&cont[..12], &cont[12..]]);
        assert_eq!(text, "");
        assert_eq!(calls, vec![("get_weather".to_string(), "{\"city\":\"Paris\"}".to_string())]);
        assert!(done);
    }

    #[test]
    fn garbage_after_a_forced_opening_is_still_a_call() {
        let (text, calls, done) = run(forced(ToolChoice::Named("search".into())), false, &["zq!! 3 <<", " random"]);
        assert_eq!((text.as_str(), done), ("", true));
        assert_eq!(calls, vec![("search".to_string(), "{}".to_string())]);
        let (text, calls, _) = run(forced(ToolChoice::Required), false, &["</", &format!("{D}tool_calls> hi")]);
        assert_eq!(text, "");
        assert_eq!(calls, vec![("get_weather".to_string(), "{}".to_string())]);
        // Without the forcing the same output is plain text.
        let (text, calls, done) = run(None, false, &["zq!! 3 <<", " random"]);
        assert_eq!((text.as_str(), calls.len(), done), ("zq!! 3 << random", 0, false));
    }

    #[test]
    fn a_single_call_ends_the_block() {
        let two = format!("<{D}invoke name=\"search\">\n</{D}invoke>\n<{D}invoke name=\"get_weather\">\n</{D}invoke>\n</{D}tool_calls>");
        let (_, calls, done) = run(forced(ToolChoice::Required), true, &[&two]);
        assert_eq!(calls, vec![("search".to_string(), "{}".to_string())]);
        assert!(done);
        let (_, calls, _) = run(forced(ToolChoice::Required), false, &[&two]);
        assert_eq!(calls.len(), 2);
    }

    #[test]
    fn a_block_ended_by_the_output_end_is_cut_short() {
        // The model closes the forced call: not cut.
        let whole = format!("<{D}parameter name=\"city\" string=\"true\">Paris</{D}parameter>\n</{D}invoke>\n</{D}tool_calls>");
        let (_, calls, done, cut) = run_cut(forced(ToolChoice::Named("get_weather".into())), false, &[&whole]);
        assert_eq!((calls.len(), done, cut), (1, true, false));
        // The output ends inside it (token limit, stop string): still a call, but cut short.
        let (_, calls, done, cut) = run_cut(forced(ToolChoice::Named("get_weather".into())), false, &[&whole[..40]]);
        assert_eq!(calls, vec![("get_weather".to_string(), "{}".to_string())]);
        assert!(done && cut);
        // Malformed output mid-stream ends the block before the output's end: not cut.
        let (_, calls, done, cut) = run_cut(forced(ToolChoice::Required), false, &["zq!! 3 <<", " random"]);
        assert_eq!((calls.len(), done, cut), (1, true, false));
        // Nothing at all after the opening (a limit of 0 tokens left).
        let (_, calls, _, cut) = run_cut(forced(ToolChoice::Required), false, &[]);
        assert_eq!((calls.len(), cut), (1, true));
    }

    #[test]
    fn without_tool_calls_a_block_is_text() {
        // `tool_choice: none` in thinking mode: the parser splits the reasoning, but a tool-call block
        // the model writes anyway is text, in order with the text around it, never a call.
        let block = format!("<{D}tool_calls>\n<{D}invoke name=\"get_weather\">\n<{D}parameter name=\"city\" string=\"true\">Paris</{D}parameter>\n</{D}invoke>\n</{D}tool_calls>");
        let (events, mut rx) = mpsc::unbounded_channel();
        let params = GenParams { max_tokens: 16, sampling: SamplerConfig::default(), stops: Vec::new(), thinking: true, parse_tools: false, id_prefix: "call_", script: None, logprobs: None, forced: None, single_call: false };
        let j = Job { kind: "chat", prompt: Vec::new(), rendered: None, params, events, cancel: Arc::new(AtomicBool::new(false)), queued: Instant::now() };
        let mut out = Output::new(&j, Arc::new(Mutex::new(ToolMemory::new(8))), true);
        let all = format!("hmm</think>Before.\n\n{block} after.");
        for piece in [&all[..20], &all[20..70], &all[70..]] {
            out.push(piece);
        }
        out.finish();
        let (mut reasoning, mut text, mut other) = (String::new(), String::new(), 0);
        while let Ok(e) = rx.try_recv() {
            match e {
                Event::Reasoning(r) => reasoning.push_str(&r),
                Event::Text(t) => text.push_str(&t),
                _ => other += 1,
            }
        }
        assert_eq!(reasoning, "hmm");
        assert_eq!(text, format!("Before.\n\n{block} after."));
        assert_eq!((other, out.block_done, out.calls.len()), (0, false, 0));
        // Cut inside the block: what there is of it, as text.
        let (events, mut rx) = mpsc::unbounded_channel();
        let j = Job { events, ..j };
        let mut out = Output::new(&j, Arc::new(Mutex::new(ToolMemory::new(8))), true);
        out.push(&format!("x</think>Hi {}", &block[..60]));
        out.finish();
        let mut text = String::new();
        while let Ok(e) = rx.try_recv() {
            if let Event::Text(t) = e {
                text.push_str(&t);
            }
        }
        assert_eq!(text, format!("Hi {}", &block[..60]));
    }
}
