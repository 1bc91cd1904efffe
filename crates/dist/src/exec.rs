//! The stage executor trait: one forward over a stage's layers, local or remote. A route is a list of
//! `StageExec`s run in order; the local one (coordinator's own layers, or a worker serving requests)
//! is [`LocalStage`], the remote one is [`crate::coordinator::RemoteStage`].
use bytes::Bytes;
use crate::codec;
use crate::error::{DistError, Result};
use crate::protocol::{fnv1a_tokens, ErrorKind, Payload, Want, FNV_OFFSET};
use ds4_engine::{Backend, Engine};
use ds4_model::{KvState, LayerRange, Logits, Stage};
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// Hidden states as they travel between stages: already in the wire format (a `Bytes` that is a
/// slice of the frame they came in, or a pooled buffer they were encoded into).
#[derive(Debug, Clone, PartialEq)]
pub struct Activations {
    pub bits: u8,
    pub data: Bytes,
}

/// Borrowed activations (a worker's are a slice of its reused frame buffer).
#[derive(Debug, Clone, Copy)]
pub struct ActRef<'a> {
    pub bits: u8,
    pub data: &'a [u8],
}

impl Activations {
    pub fn as_ref(&self) -> ActRef<'_> { ActRef { bits: self.bits, data: &self.data } }
}

pub struct StageRequest<'a> {
    pub session: u64,
    pub pos: usize,
    /// FNV-1a of the tokens before `pos`.
    pub prefix_hash: u64,
    pub tokens: &'a [u32],
    pub input: Option<ActRef<'a>>,
    pub want: Want,
    /// Format of the hidden output of an intermediate stage.
    pub bits: u8,
}

/// What one hop did, for telemetry.
#[derive(Debug, Clone, Copy, Default)]
pub struct HopTiming {
    pub eval: Duration,
    pub forward_send: Duration,
    pub downstream_wait: Duration,
    pub input_bytes: usize,
    pub output_bytes: usize,
}

pub struct StageOutput {
    pub payload: Payload,
    pub timing: HopTiming,
}

/// Where a stage runs, for messages and telemetry.
#[derive(Debug, Clone)]
pub struct StageInfo {
    pub range: LayerRange,
    /// "local" or the worker's address.
    pub location: String,
}

impl StageInfo {
    pub fn describe(&self, index: usize) -> String {
        format!("stage {index} (layers {} {})", self.range.label(), if self.location == "local" { "local".to_string() } else { format!("at worker {}", self.location) })
    }
}

pub trait StageExec: Send {
    fn info(&self) -> StageInfo;
    fn forward(&mut self, req: &StageRequest) -> Result<StageOutput>;
    /// Drops a session's KV (all sessions for None).
    fn reset(&mut self, session: Option<u64>) -> Result<()>;
    /// The remote connection, when the stage is remote (used by the pipelined prefill).
    fn remote(&self) -> Option<std::sync::Arc<crate::coordinator::WorkerConn>> { None }
}

/// A per-request failure that the coordinator can repair by replaying (the KV is elsewhere).
pub fn is_kv_mismatch(e: &DistError) -> bool { matches!(e, DistError::Stage(m) if m.contains("KV mismatch")) }

struct LocalSession {
    kv: KvState,
    hash: u64,
}

/// A stage computed in this process (on the engine's backend), with one KV per session; a backend
/// that holds one KV state (a GPU) keeps only the latest session, and the others get replayed.
pub struct LocalStage {
    pub engine: Engine,
    sessions: HashMap<u64, LocalSession>,
    scratch: Vec<f32>,
    /// Hidden rows and logits gathered over the pieces of a batch larger than the engine takes.
    hidden_out: Vec<f32>,
    logits_out: Vec<f32>,
    max_sessions: usize,
}

/// Tokens of a CUDA stage's warm-up forward: enough for the prefill kernels and the staging path
/// (a Flash token's hidden rows are 64 KiB), a fraction of a full chunk's time at start.
const WARM_TOKENS: usize = 1024;

impl LocalStage {
    /// A CPU stage (batches of any size in one forward call).
    pub fn new(stage: Stage, ctx: usize) -> Self { Self::from_engine(Engine::from_stage(stage, ctx)) }

    /// A loaded engine (any backend); batches larger than its prefill chunk run in pieces.
    pub fn from_engine(engine: Engine) -> Self {
        let max_sessions = if engine.single_kv() { 1 } else { 8 };
        let mut s = Self { engine, sessions: HashMap::new(), scratch: Vec::new(), hidden_out: Vec::new(), logits_out: Vec::new(), max_sessions };
        s.warm_hop_buffers();
        s
    }

    /// Bytes of one full prefill chunk's hidden rows at 32 bits: what a hop of this stage sends.
    pub fn chunk_hidden_bytes(&self) -> usize { self.engine.prefill_chunk.min(self.engine.ctx) * self.hc_dim() * 4 }

    /// Touches, once at start, the host memory a GPU stage's hops of a full prefill chunk write: the
    /// downloaded hidden rows and the encoded frame's buffer (a stage without the head sends), and the
    /// decoded rows of a 16- or 8-bit frame (a stage without the embedding receives). The first request
    /// otherwise pays their page faults (Flash, 4096-token chunks: 256 MiB each).
    fn warm_hop_buffers(&mut self) {
        if !self.engine.backend().is_gpu() {
            return;
        }
        let n = self.engine.prefill_chunk.min(self.engine.ctx);
        if self.engine.stage.w.embed.is_none() {
            self.scratch.resize(n * self.hc_dim(), 0.0);
            if self.engine.backend() == Backend::Cuda {
                self.warm_forward(n.min(WARM_TOKENS));
            }
        }
        if self.engine.stage.w.head.is_none() && self.engine.hidden(n).is_ok() {
            crate::wire::warm_pool(self.chunk_hidden_bytes());
        }
    }

    /// One throwaway forward of `n` tokens (zero hidden rows, on a state dropped after it) by a CUDA
    /// stage that receives hidden rows: a worker is ready when it starts, and its first request does
    /// not pay the GPU's first launches (CUDA loads a kernel at its first use) or the staging buffers'
    /// allocation (~100 ms of a flash:12 half-model chunk's eval on an H100). wgpu builds its
    /// pipelines at load. A failure here is left to the first request to report.
    fn warm_forward(&mut self, n: usize) {
        let t0 = Instant::now();
        let mut kv = self.engine.new_kv();
        let toks = vec![0u32; n];
        let want = if self.engine.stage.w.head.is_some() { Logits::Last } else { Logits::None };
        let r = self.engine.forward(&mut kv, &toks, Some(&self.scratch[..n * self.hc_dim()]), want).map(|_| ());
        eprintln!("ds4: distributed stage warm-up: {n} tokens in {:.2}s{}", t0.elapsed().as_secs_f64(), if r.is_ok() { "" } else { " (failed)" });
    }

    pub fn stage(&self) -> &Stage { &self.engine.stage }
    pub fn ctx(&self) -> usize { self.engine.ctx }
    pub fn hc_dim(&self) -> usize { self.engine.cfg().hc_dim() }
    pub fn row(&self) -> usize { self.engine.cfg().n_embd }

    /// Position of a session's KV (0 when unknown).
    pub fn pos(&self, session: u64) -> usize { self.sessions.get(&session).map_or(0, |s| s.kv.pos) }

    /// Runs the request; errors with kind for the wire.
    pub fn run(&mut self, req: &StageRequest) -> std::result::Result<(Payload, Duration), (ErrorKind, String)> {
        let t0 = Instant::now();
        let fail = |m: String| (ErrorKind::Failed, m);
        if req.pos == 0 && !self.sessions.contains_key(&req.session) && self.sessions.len() >= self.max_sessions {
            // Bounded memory (one state on a GPU): forget the oldest-numbered session.
            if let Some(&k) = self.sessions.keys().min() {
                self.sessions.remove(&k);
            }
        }
        if req.pos == 0 {
            let kv = self.engine.new_kv();
            self.sessions.insert(req.session, LocalSession { kv, hash: FNV_OFFSET });
        }
        let Self { engine, sessions, scratch, hidden_out, logits_out, .. } = self;
        let s = match sessions.get_mut(&req.session) {
            Some(s) => s,
            None => return Err((ErrorKind::KvMismatch, format!("KV mismatch: unknown session {} at pos {}", req.session, req.pos))),
        };
        if s.kv.pos != req.pos || s.hash != req.prefix_hash {
            return Err((
                ErrorKind::KvMismatch,
                format!("KV mismatch: session {} holds {} tokens (prefix hash {:016x}), request is at pos {} (prefix hash {:016x})", req.session, s.kv.pos, s.hash, req.pos, req.prefix_hash),
            ));
        }
        if req.tokens.is_empty() {
            return Err(fail("forward request without tokens".into()));
        }
        let n = req.tokens.len();
        let hd = engine.cfg().hc_dim();
        let row = engine.cfg().n_embd;
        let hidden_in = match req.input {
            // 32-bit input in an aligned frame buffer: used in place (no decode pass).
            Some(a) if codec::as_f32(a.data, n * hd, a.bits).is_some() => codec::as_f32(a.data, n * hd, a.bits),
            Some(a) => {
                codec::decode(a.data, n * hd, row, a.bits, scratch).map_err(|e| fail(e.to_string()))?;
                Some(&scratch[..])
            }
            None => None,
        };
        let has_head = engine.stage.w.head.is_some();
        let logits = match req.want {
            Want::Hidden | Want::Ack => Logits::None,
            Want::AllLogits => Logits::All,
            Want::LastLogits | Want::Greedy { .. } => Logits::Last,
        };
        if logits != Logits::None && !has_head {
            return Err(fail(format!("stage {} does not own the output head; cannot produce logits", engine.range().label())));
        }
        let piece = engine.prefill_chunk.clamp(1, n);
        // A GPU takes the greedy pick and its log-probability itself: 8 bytes come back, not the row.
        let device_pick = match req.want {
            Want::Greedy { top_logprobs: 0 } if piece == n => match engine.forward_top1(&mut s.kv, req.tokens, hidden_in) {
                Ok(p) => p,
                Err(e) => {
                    sessions.remove(&req.session);
                    return Err(fail(e.to_string()));
                }
            },
            _ => None,
        };
        let payload = if let Some((id, logprob)) = device_pick {
            Payload::Token { id, logprob, top: Vec::new() }
        } else if piece == n {
            // One forward call: decode, and batches the engine takes whole.
            let l = match engine.forward(&mut s.kv, req.tokens, hidden_in, logits) {
                Ok(l) => l,
                Err(e) => {
                    // The KV may be half-updated: forget the session so the coordinator replays.
                    sessions.remove(&req.session);
                    return Err(fail(e.to_string()));
                }
            };
            if req.want == Want::Hidden {
                let h = engine.hidden(n).map_err(|e| fail(e.to_string()))?;
                payload(req.want, &[], h, row, req.bits).map_err(fail)?
            } else {
                payload(req.want, l, &[], row, req.bits).map_err(fail)?
            }
        } else {
            // Larger than the engine's batch (a GPU's buffers are sized for its prefill chunk): in pieces.
            hidden_out.clear();
            logits_out.clear();
            for (k, toks) in req.tokens.chunks(piece).enumerate() {
                let (a, m) = (k * piece, toks.len());
                let want = if logits == Logits::Last && a + m < n { Logits::None } else { logits };
                let hin = hidden_in.map(|h| &h[a * hd..(a + m) * hd]);
                match engine.forward(&mut s.kv, toks, hin, want) {
                    Ok(l) => logits_out.extend_from_slice(l),
                    Err(e) => {
                        sessions.remove(&req.session);
                        return Err(fail(e.to_string()));
                    }
                }
                progress_step(engine);
                if req.want == Want::Hidden {
                    hidden_out.extend_from_slice(engine.hidden(m).map_err(|e| fail(e.to_string()))?);
                }
            }
            payload(req.want, logits_out, hidden_out, row, req.bits).map_err(fail)?
        };
        progress_step(engine);
        s.hash = fnv1a_tokens(s.hash, req.tokens);
        Ok((payload, t0.elapsed()))
    }

    pub fn drop_sessions(&mut self, session: Option<u64>) {
        match session {
            Some(s) => {
                self.sessions.remove(&s);
            }
            None => self.sessions.clear(),
        }
    }
}

/// The reply to `want` from a forward call's logits rows or hidden rows (whichever it asked for).
fn payload(want: Want, logits: &[f32], hidden: &[f32], row: usize, bits: u8) -> std::result::Result<Payload, String> {
    Ok(match want {
        Want::Ack => Payload::Ack,
        Want::LastLogits | Want::AllLogits => Payload::Logits(logits.to_vec()),
        Want::Greedy { top_logprobs } => greedy(logits, top_logprobs as usize),
        Want::Hidden => {
            // A pooled buffer: the frame's bytes come back to the pool once sent (no allocation per hop).
            let mut data = crate::wire::take_buf();
            codec::encode(hidden, row, bits, &mut data).map_err(|e| e.to_string())?;
            Payload::Hidden { bits, data: Bytes::from(data) }
        }
    })
}

/// The CPU stage reports each layer to the progress hook itself; a GPU forward call is one step.
fn progress_step(engine: &Engine) {
    if engine.backend() != Backend::Cpu {
        if let Some(p) = &engine.stage.on_progress {
            p(0);
        }
    }
}

/// Greedy pick (the sampler's argmax: lowest index among equal maxima, NaN as -inf) with its
/// log-probability and the top `k`.
pub fn greedy(logits: &[f32], k: usize) -> Payload {
    let best = ds4_tokenizer::sampling::argmax(logits) as usize;
    let m = logits[best];
    let lse = m + logits.iter().map(|&v| (v - m).exp()).sum::<f32>().ln();
    let mut top = Vec::new();
    if k > 0 {
        let mut idx: Vec<u32> = (0..logits.len() as u32).collect();
        let k = k.min(idx.len());
        idx.select_nth_unstable_by(k - 1, |&a, &b| logits[b as usize].total_cmp(&logits[a as usize]).then(a.cmp(&b)));
        idx.truncate(k);
        idx.sort_by(|&a, &b| logits[b as usize].total_cmp(&logits[a as usize]).then(a.cmp(&b)));
        top = idx.into_iter().map(|i| (i, logits[i as usize] - lse)).collect();
    }
    Payload::Token { id: best as u32, logprob: m - lse, top }
}

impl StageExec for LocalStage {
    fn info(&self) -> StageInfo { StageInfo { range: self.engine.range(), location: "local".into() } }

    fn forward(&mut self, req: &StageRequest) -> Result<StageOutput> {
        let input_bytes = req.input.map_or(0, |a| a.data.len());
        match self.run(req) {
            Ok((payload, eval)) => {
                let output_bytes = payload_bytes(&payload);
                Ok(StageOutput { payload, timing: HopTiming { eval, input_bytes, output_bytes, ..HopTiming::default() } })
            }
            Err((_, m)) => Err(DistError::Stage(format!("{} failed: {m}", self.info().describe(0)))),
        }
    }

    fn reset(&mut self, session: Option<u64>) -> Result<()> {
        self.drop_sessions(session);
        Ok(())
    }
}

pub fn payload_bytes(p: &Payload) -> usize {
    match p {
        Payload::Ack => 0,
        Payload::Hidden { data, .. } => data.len(),
        Payload::Logits(l) => l.len() * 4,
        Payload::Token { top, .. } => 8 + top.len() * 8,
    }
}
