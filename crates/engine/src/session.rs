//! A conversation's state on the engine: KV cache, token history, prefill and generation loops.
use crate::engine::Engine;
use crate::error::EngineError;
use crate::speculative::MtpState;
use ds4_model::{residency, KvState, Logits};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    Eos,
    MaxTokens,
    Cancelled,
    /// The caller's token callback asked to stop (e.g. a stop string matched).
    Caller,
    ContextFull,
}

#[derive(Debug, Clone, Default)]
pub struct GenStats {
    pub prompt_tokens: usize,
    pub prefilled_tokens: usize,
    pub prefill_time: Duration,
    pub gen_tokens: usize,
    pub gen_time: Duration,
    /// MTP: tokens drafted and verified, and how many of them were accepted.
    pub drafted: usize,
    pub accepted: usize,
}

impl GenStats {
    /// Accepted drafts over drafted ones (0 when nothing was drafted).
    pub fn acceptance(&self) -> f64 { if self.drafted > 0 { self.accepted as f64 / self.drafted as f64 } else { 0.0 } }
    pub fn prefill_tps(&self) -> f64 { rate(self.prefilled_tokens, self.prefill_time) }
    pub fn gen_tps(&self) -> f64 { rate(self.gen_tokens, self.gen_time) }
}

fn rate(n: usize, t: Duration) -> f64 {
    if t.as_secs_f64() > 0.0 { n as f64 / t.as_secs_f64() } else { 0.0 }
}

pub struct Session {
    pub kv: KvState,
    pub tokens: Vec<u32>,
    /// Logits after the last consumed token (empty before the first).
    pub logits: Vec<f32>,
    pub prefill_chunk: usize,
    /// The MTP drafter's state when the engine has one.
    pub(crate) mtp: Option<MtpState>,
}

/// A copy of a session's state to return to (`Session::snapshot` / `restore`): KV, tokens, logits and
/// the MTP drafter's state.
#[derive(Clone)]
pub struct SessionSnapshot {
    kv: KvState,
    tokens: Vec<u32>,
    logits: Vec<f32>,
    mtp: Option<MtpState>,
}

impl Session {
    pub fn snapshot(&self) -> SessionSnapshot {
        SessionSnapshot { kv: self.kv.clone(), tokens: self.tokens.clone(), logits: self.logits.clone(), mtp: self.mtp.clone() }
    }

    pub fn restore(&mut self, s: SessionSnapshot) {
        (self.kv, self.tokens, self.logits, self.mtp) = (s.kv, s.tokens, s.logits, s.mtp);
    }

    pub fn new(engine: &Engine) -> Self {
        let mtp = engine.mtp.as_ref().map(|m| MtpState::new(&m.model, engine.ctx));
        Self { kv: engine.stage.new_kv(engine.ctx), tokens: Vec::new(), logits: Vec::new(), prefill_chunk: engine.prefill_chunk, mtp }
    }

    /// Starts over (position 0), in the same device KV slot.
    pub fn reset(&mut self, engine: &Engine) {
        let slot = self.kv.slot;
        self.kv = engine.stage.new_kv(engine.ctx);
        self.kv.slot = slot;
        self.tokens.clear();
        self.logits.clear();
        if let (Some(st), Some(m)) = (self.mtp.as_mut(), engine.mtp.as_ref()) {
            st.reset(&m.model);
        }
    }

    /// Feeds the main model's hidden rows of the tokens just consumed to the MTP drafter (if any).
    pub(crate) fn mtp_observe(&mut self, engine: &mut Engine, tokens: &[u32]) -> Result<(), EngineError> {
        let (Some(st), true) = (self.mtp.as_mut(), engine.mtp.is_some()) else { return Ok(()) };
        // The rows come from the backend that ran the step (the device on a GPU backend).
        let mut h = std::mem::take(&mut st.scratch);
        h.clear();
        h.extend_from_slice(engine.hidden(tokens.len())?);
        let m = engine.mtp.as_mut().expect("checked above");
        let r = st.observe(&mut m.drafter(), &engine.stage, &h, tokens, self.kv.pos, false);
        st.scratch = h;
        r
    }

    /// Makes the session hold exactly `prompt`: keeps a common prefix when `prompt` extends the history,
    /// otherwise starts over. Returns the number of tokens actually prefilled.
    pub fn sync(
        &mut self,
        engine: &mut Engine,
        prompt: &[u32],
        progress: &mut dyn FnMut(usize, usize),
        cancel: &AtomicBool,
    ) -> Result<usize, EngineError> {
        if prompt.len() > engine.ctx {
            return Err(EngineError::Invalid(format!("prompt has {} tokens, context is {}", prompt.len(), engine.ctx)));
        }
        let reuse = prompt.starts_with(&self.tokens) && !self.tokens.is_empty() && prompt.len() > self.tokens.len();
        if !reuse {
            self.reset(engine);
        }
        residency::set_phase(residency::Phase::Prefill);
        let start = self.tokens.len();
        let todo = &prompt[start..];
        let total = todo.len();
        let mut done = 0;
        // The MTP drafter is window-only: of the prompt's (hidden, token) pairs it only ever reads the
        // last window's, so earlier chunks are not brought to it (their hidden rows stay on the
        // device; the drafter restarts its cache at the first chunk it sees).
        let drafter_from = prompt.len().saturating_sub(engine.cfg().swa + 1);
        for chunk in todo.chunks(self.prefill_chunk.clamp(1, engine.prefill_chunk)) {
            if cancel.load(Ordering::Relaxed) {
                return Err(EngineError::Invalid("cancelled".into()));
            }
            let l = engine.forward(&mut self.kv, chunk, None, Logits::Last)?;
            self.logits.clear();
            self.logits.extend_from_slice(l);
            self.tokens.extend_from_slice(chunk);
            if self.tokens.len() > drafter_from {
                self.mtp_observe(engine, chunk)?;
            }
            done += chunk.len();
            progress(done, total);
        }
        Ok(total)
    }

    /// Feeds one token and refreshes the logits.
    pub fn step(&mut self, engine: &mut Engine, token: u32) -> Result<(), EngineError> {
        let l = engine.forward(&mut self.kv, std::slice::from_ref(&token), None, Logits::Last)?;
        self.logits.clear();
        self.logits.extend_from_slice(l);
        self.tokens.push(token);
        self.mtp_observe(engine, std::slice::from_ref(&token))
    }

    /// Samples up to `max_tokens` tokens. `on_token` returns false to stop. `greedy` says that `sample`
    /// is the argmax for every token: the engine may then take it on the device (GPU backend), and the
    /// logits of the last token are fetched once at the end instead of after every step.
    #[allow(clippy::too_many_arguments)]
    pub fn generate(
        &mut self,
        engine: &mut Engine,
        max_tokens: usize,
        eos: Option<u32>,
        greedy: bool,
        sample: &mut dyn FnMut(&[f32]) -> u32,
        on_token: &mut dyn FnMut(u32) -> bool,
        cancel: &AtomicBool,
        stats: &mut GenStats,
    ) -> Result<StopReason, EngineError> {
        if self.logits.is_empty() {
            return Err(EngineError::Invalid("nothing to continue from: empty prompt".into()));
        }
        residency::set_phase(residency::Phase::Decode);
        let t0 = Instant::now();
        // The next token when the device took it; the host logits are then those of an earlier step.
        let mut next: Option<u32> = None;
        let r = self.generate_loop(engine, max_tokens, eos, greedy, &mut next, sample, on_token, cancel, stats);
        if next.is_some() {
            if r.is_ok() {
                engine.last_logits(&mut self.logits)?;
            } else {
                // Which step failed is unknown: nothing stale to continue from.
                self.logits.clear();
            }
        }
        stats.gen_time += t0.elapsed();
        r
    }

    #[allow(clippy::too_many_arguments)]
    fn generate_loop(
        &mut self,
        engine: &mut Engine,
        max_tokens: usize,
        eos: Option<u32>,
        greedy: bool,
        next: &mut Option<u32>,
        sample: &mut dyn FnMut(&[f32]) -> u32,
        on_token: &mut dyn FnMut(u32) -> bool,
        cancel: &AtomicBool,
        stats: &mut GenStats,
    ) -> Result<StopReason, EngineError> {
        for _ in 0..max_tokens {
            if cancel.load(Ordering::Relaxed) {
                return Ok(StopReason::Cancelled);
            }
            let tok = match *next {
                Some(t) => t,
                None => sample(&self.logits),
            };
            stats.gen_tokens += 1;
            if Some(tok) == eos {
                return Ok(StopReason::Eos);
            }
            if !on_token(tok) {
                return Ok(StopReason::Caller);
            }
            if self.tokens.len() >= engine.ctx {
                return Ok(StopReason::ContextFull);
            }
            // Greedy: the engine takes the argmax itself where it can (None: it ran nothing).
            match if greedy { engine.forward_top1(&mut self.kv, std::slice::from_ref(&tok), None)?.map(|(id, _)| id) } else { None } {
                Some(t) => {
                    self.tokens.push(tok);
                    *next = Some(t);
                }
                None => self.step(engine, tok)?,
            }
        }
        Ok(StopReason::MaxTokens)
    }
}
