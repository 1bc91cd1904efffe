//! The stage executor trait: one forward over a stage's layers, local or remote. A route is a list of
//! `StageExec`s run in order; the local one (coordinator's own layers, or a worker serving requests)
//! is [`LocalStage`], the remote one is [`crate::coordinator::RemoteStage`].
use crate::codec;
use crate::error::{DistError, Result};
use crate::protocol::{fnv1a_tokens, ErrorKind, Payload, Want, FNV_OFFSET};
use ds4_model::{KvState, LayerRange, Logits, Stage};
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// Hidden states as they travel between stages: already in the wire format.
#[derive(Debug, Clone, PartialEq)]
pub struct Activations {
    pub bits: u8,
    pub data: Vec<u8>,
}

pub struct StageRequest<'a> {
    pub session: u64,
    pub pos: usize,
    /// FNV-1a of the tokens before `pos`.
    pub prefix_hash: u64,
    pub tokens: &'a [u32],
    pub input: Option<&'a Activations>,
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

/// A stage computed in this process, with one KV per session.
pub struct LocalStage {
    pub stage: Stage,
    pub ctx: usize,
    sessions: HashMap<u64, LocalSession>,
    scratch: Vec<f32>,
    max_sessions: usize,
}

impl LocalStage {
    pub fn new(stage: Stage, ctx: usize) -> Self {
        Self { stage, ctx, sessions: HashMap::new(), scratch: Vec::new(), max_sessions: 8 }
    }

    pub fn hc_dim(&self) -> usize { self.stage.cfg.hc_dim() }
    pub fn row(&self) -> usize { self.stage.cfg.n_embd }

    /// Position of a session's KV (0 when unknown).
    pub fn pos(&self, session: u64) -> usize { self.sessions.get(&session).map_or(0, |s| s.kv.pos) }

    /// Runs the request; errors with kind for the wire.
    pub fn run(&mut self, req: &StageRequest) -> std::result::Result<(Payload, Duration), (ErrorKind, String)> {
        let t0 = Instant::now();
        let fail = |m: String| (ErrorKind::Failed, m);
        if req.pos == 0 && !self.sessions.contains_key(&req.session) && self.sessions.len() >= self.max_sessions {
            // Bounded memory: forget the oldest-numbered session.
            if let Some(&k) = self.sessions.keys().min() {
                self.sessions.remove(&k);
            }
        }
        if req.pos == 0 {
            let kv = self.stage.new_kv(self.ctx);
            self.sessions.insert(req.session, LocalSession { kv, hash: FNV_OFFSET });
        }
        let s = match self.sessions.get_mut(&req.session) {
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
        let hd = self.stage.cfg.hc_dim();
        let row = self.stage.cfg.n_embd;
        let hidden_in = match req.input {
            Some(a) => {
                codec::decode(&a.data, n * hd, row, a.bits, &mut self.scratch).map_err(|e| fail(e.to_string()))?;
                Some(&self.scratch[..])
            }
            None => None,
        };
        let has_head = self.stage.w.head.is_some();
        let logits = match req.want {
            Want::Hidden | Want::Ack => Logits::None,
            Want::AllLogits => Logits::All,
            Want::LastLogits | Want::Greedy { .. } => Logits::Last,
        };
        if logits != Logits::None && !has_head {
            return Err(fail(format!("stage {} does not own the output head; cannot produce logits", self.stage.w.range.label())));
        }
        // On error the KV may be half-updated: forget the session so the coordinator replays.
        let out = match self.stage.forward(&mut s.kv, req.tokens, hidden_in, logits) {
            Ok(l) => l,
            Err(e) => {
                self.sessions.remove(&req.session);
                return Err(fail(e.to_string()));
            }
        };
        s.hash = fnv1a_tokens(s.hash, req.tokens);
        let payload = match req.want {
            Want::Ack => Payload::Ack,
            Want::LastLogits | Want::AllLogits => Payload::Logits(out.to_vec()),
            Want::Greedy { top_logprobs } => greedy(out, top_logprobs as usize),
            Want::Hidden => {
                let mut data = Vec::new();
                codec::encode(self.stage.hidden(n), row, req.bits, &mut data).map_err(|e| fail(e.to_string()))?;
                Payload::Hidden { bits: req.bits, data }
            }
        };
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
    fn info(&self) -> StageInfo { StageInfo { range: self.stage.w.range, location: "local".into() } }

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
