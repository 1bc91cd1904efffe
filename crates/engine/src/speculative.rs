//! MTP speculative decoding: the MTP block drafts up to `--mtp-draft` tokens from the main model's last
//! hidden state, the main model verifies them in one forward call (its multi-token forward computes each
//! token with the same arithmetic as a decode step, so the logits are bit-identical), the longest prefix
//! the sampler accepts is kept and the KV state is rolled back past the first rejection.
//!
//! Acceptance is the speculative-sampling rule (accept draft d ~ q with probability min(1, p(d)/q(d)),
//! else draw from the normalised residual max(0, p − q)), where p and q are the sampler's final
//! distributions (temperature, min-p, top-k, top-p applied): the output distribution is the sampler's.
//! Greedy is the case of one-hot p: a draft is kept iff it is the argmax, so greedy output is
//! token-for-token the output without MTP.
use crate::drafter::{DeviceMtp, Drafter};
use crate::error::EngineError;
use ds4_model::mtp::Mtp;
use ds4_model::KvState;
use ds4_tokenizer::sampling::Sampler;
use std::path::PathBuf;

/// `--mtp FILE --mtp-draft N --mtp-margin F`.
#[derive(Debug, Clone, PartialEq)]
pub struct MtpOptions {
    pub path: PathBuf,
    /// Most tokens drafted per step (1..=4).
    pub draft: usize,
    /// Confidence gate: a draft is proposed only while the MTP's top-1 logit leads its top-2 by at least
    /// this much (0 = always draft `draft` tokens).
    pub margin: f32,
}

impl MtpOptions {
    pub const MAX_DRAFT: usize = 4;
    /// The C engine's defaults: draft 1, margin 3.0.
    pub fn new(path: PathBuf) -> Self { Self { path, draft: 1, margin: 3.0 } }

    /// Checks the values (messages name the flag).
    pub fn validate(&self) -> Result<(), EngineError> {
        if !(1..=Self::MAX_DRAFT).contains(&self.draft) {
            return Err(EngineError::Invalid(format!("--mtp-draft must be between 1 and {}, got {}", Self::MAX_DRAFT, self.draft)));
        }
        if !(self.margin.is_finite() && self.margin >= 0.0) {
            return Err(EngineError::Invalid(format!("--mtp-margin must be a number >= 0 (the logit lead of the draft's top token over its second), got {}", self.margin)));
        }
        Ok(())
    }
}

/// A loaded MTP drafter and its settings.
pub struct MtpEngine {
    /// The drafter on the GPU backend's device (declared first: dropped before the block it was
    /// built from, whose mapped weights a device may read in place).
    pub(crate) device: Option<DeviceMtp>,
    /// The block on the host: the drafter on the CPU backend; on a GPU backend its configuration
    /// (weights bound in place in the file, not run).
    pub model: Mtp,
    pub opts: MtpOptions,
}

/// Drafter cache id of callers outside a session (`MtpEngine::forward`); sessions take 1, 2, ...
const EXTERNAL_ID: u64 = 0;

/// A fresh drafter cache id (see `DeviceMtp`: which cache the device holds).
fn next_id() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(EXTERNAL_ID + 1);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

impl MtpEngine {
    pub(crate) fn new(model: Mtp, opts: MtpOptions, device: Option<DeviceMtp>) -> Self { Self { device, model, opts } }

    /// The drafter drafts on the GPU backend's device (else on the CPU).
    pub fn on_device(&self) -> bool { self.device.is_some() }

    /// Device bytes of the drafter (0 on the CPU).
    pub fn device_bytes(&self) -> u64 { self.device.as_ref().map_or(0, |d| d.bytes) }

    pub(crate) fn drafter(&mut self) -> Drafter<'_> {
        match self.device.as_mut() {
            Some(dev) => Drafter::Device { dev, cpu: &self.model },
            None => Drafter::Cpu(&mut self.model),
        }
    }

    /// A fresh drafter cache for `ctx` positions (on a GPU backend it carries the position only).
    pub fn new_kv(&self, ctx: usize) -> KvState { self.model.new_kv(ctx) }

    /// Runs the block over pairs at `kv.pos..` where the engine drafts (`Mtp::forward`'s contract):
    /// `hidden` one HC row of the main model per pair, `tokens[i]` the token after row i; the logits of
    /// the last pair's next token when `logits`. The device drafter keeps one cache: a session drafting
    /// in between starts this one over.
    pub fn forward(&mut self, main: &ds4_model::Stage, kv: &mut KvState, hidden: &[f32], tokens: &[u32], logits: bool) -> Result<&[f32], EngineError> {
        match self.device.as_mut() {
            Some(dev) => dev.forward(main, EXTERNAL_ID, kv, hidden, tokens, logits),
            None => Ok(self.model.forward(main, kv, hidden, tokens, logits)?),
        }
    }
}

/// What speculative decoding needs from the caller's sampler.
pub trait SpecSampler {
    /// The next token from these logits, as the plain (non-speculative) loop picks it.
    fn pick(&mut self, logits: &[f32]) -> u32;
    /// The distribution `pick` draws from now, as (id, probability) pairs summing to 1.
    fn target(&mut self, logits: &[f32], out: &mut Vec<(u32, f32)>);
    /// The distribution a draft is drawn from (the same settings; may ignore state-dependent switches).
    fn proposal(&mut self, logits: &[f32], out: &mut Vec<(u32, f32)>) { self.target(logits, out) }
    /// `proposal` where the logits' top token (lowest index of the largest) is already known: a greedy
    /// sampler proposes it without another pass over the logits.
    fn proposal_top(&mut self, logits: &[f32], _top: u32, out: &mut Vec<(u32, f32)>) { self.proposal(logits, out) }
    /// Uniform in [0, 1).
    fn uniform(&mut self) -> f64;
    /// Whether `pick` and `target` are the argmax now (greedy): a GPU backend then takes each verify
    /// row's pick on the device, and no logits row comes back per step.
    fn greedy(&self) -> bool { false }
}

impl SpecSampler for Sampler {
    fn pick(&mut self, logits: &[f32]) -> u32 { self.sample(logits) }
    fn target(&mut self, logits: &[f32], out: &mut Vec<(u32, f32)>) { self.distribution(logits, false, out) }
    fn proposal_top(&mut self, logits: &[f32], top: u32, out: &mut Vec<(u32, f32)>) {
        if self.is_greedy() {
            // `distribution`'s greedy answer: the argmax with probability 1.
            out.clear();
            out.push((top, 1.0));
        } else {
            self.distribution(logits, false, out)
        }
    }
    fn uniform(&mut self) -> f64 { Sampler::uniform(self) }
    fn greedy(&self) -> bool { self.is_greedy() }
}

/// Greedy verification with drafts the caller chooses: `propose(n)` is the token proposed for the
/// n-th generated token, counted by `emitted` (the caller's `on_token` sets it to the tokens seen so
/// far). For tests and benchmarks that need a known acceptance (random weights accept nothing);
/// greedy targets are one-hot, so acceptance is exact.
pub struct ScriptedDrafts {
    pub emitted: std::rc::Rc<std::cell::Cell<usize>>,
    seen: usize,
    i: usize,
    propose: Box<dyn FnMut(usize) -> u32>,
}

impl ScriptedDrafts {
    /// The sampler and the counter of emitted tokens it shares with the caller.
    pub fn new(propose: impl FnMut(usize) -> u32 + 'static) -> (Self, std::rc::Rc<std::cell::Cell<usize>>) {
        let emitted = std::rc::Rc::new(std::cell::Cell::new(0));
        (Self { emitted: emitted.clone(), seen: usize::MAX, i: 0, propose: Box::new(propose) }, emitted)
    }
}

impl SpecSampler for ScriptedDrafts {
    fn pick(&mut self, l: &[f32]) -> u32 { ds4_tokenizer::sampling::argmax(l) }
    fn target(&mut self, l: &[f32], out: &mut Vec<(u32, f32)>) {
        out.clear();
        out.push((ds4_tokenizer::sampling::argmax(l), 1.0));
    }
    fn proposal(&mut self, _l: &[f32], out: &mut Vec<(u32, f32)>) {
        // Drafts after the n-th token: n, n + 1, .. in turn.
        let n = self.emitted.get();
        if n != self.seen {
            (self.seen, self.i) = (n, 0);
        }
        out.clear();
        out.push(((self.propose)(n + self.i), 1.0));
        self.i += 1;
    }
    fn uniform(&mut self) -> f64 { 0.5 }
    fn greedy(&self) -> bool { true }
}

/// A token drawn from a distribution given as (id, probability) pairs, with uniform `u` in [0, 1).
pub fn draw(dist: &[(u32, f32)], u: f64) -> u32 {
    let total: f64 = dist.iter().map(|x| x.1 as f64).sum();
    let r = u * total;
    let mut acc = 0.0;
    for &(id, p) in dist {
        acc += p as f64;
        if r < acc {
            return id;
        }
    }
    dist.last().map_or(0, |x| x.0)
}

fn prob(dist: &[(u32, f32)], id: u32) -> f32 { dist.iter().find(|x| x.0 == id).map_or(0.0, |x| x.1) }

/// The speculative-sampling decision for draft `d` drawn from `q`, against the target `p`: `Ok(d)` when
/// accepted (with probability min(1, p(d)/q(d))), else `Err(t)` with `t` drawn from the normalised residual
/// max(0, p − q). A draw is taken only when the outcome is uncertain (greedy takes none).
pub fn accept(p: &[(u32, f32)], q: &[(u32, f32)], d: u32, uniform: &mut dyn FnMut() -> f64) -> Result<u32, u32> {
    let (pd, qd) = (prob(p, d), prob(q, d));
    if pd > 0.0 && (pd >= qd || (uniform() as f32) * qd < pd) {
        return Ok(d);
    }
    if let [(id, _)] = p {
        // One-hot p (greedy): the residual is p itself (q cannot hold all its mass at id: d was drawn
        // from q and is not id). No draw, nothing allocated.
        return Err(*id);
    }
    // q by id, so that the residual over p's support costs |p|·log|q| (a full-vocabulary p is 129k ids).
    let mut qs = q.to_vec();
    qs.sort_unstable_by_key(|x| x.0);
    let q_of = |id: u32| qs.binary_search_by_key(&id, |x| x.0).map_or(0.0, |i| qs[i].1);
    let mut res: Vec<(u32, f32)> = p.iter().map(|&(id, pp)| (id, (pp - q_of(id)).max(0.0))).filter(|x| x.1 > 0.0).collect();
    if res.is_empty() {
        // p <= q everywhere means p = q: a rejection has probability 0; draw from p.
        res = p.to_vec();
    }
    if res.len() == 1 {
        return Err(res[0].0);
    }
    Err(draw(&res, uniform()))
}

/// The drafter's view of a session: its own raw-window cache, the pairs (hidden row, next token) not
/// yet run through the block, and the main model's last hidden row, whose next token is not known yet.
#[derive(Clone)]
pub(crate) struct MtpState {
    pub kv: KvState,
    /// Pairs waiting for the block: after a verify step they are run together with the next draft's
    /// first pair (one pass over the block's weights instead of two).
    pub ready_h: Vec<f32>,
    pub ready_t: Vec<u32>,
    /// Hidden row (n_hc × n_embd) of the main model at position `at - 1`; empty when none is waiting.
    pub pending: Vec<f32>,
    /// The main model's position the pending row leads to.
    pub at: usize,
    pub ctx: usize,
    /// Reused copy of the main model's hidden rows (read from the backend before observing them).
    pub scratch: Vec<f32>,
    /// Which drafter cache this is (a device drafter holds one cache at a time; snapshots share it).
    pub id: u64,
}

impl MtpState {
    pub fn new(m: &Mtp, ctx: usize) -> Self {
        Self { kv: m.new_kv(ctx), ready_h: Vec::new(), ready_t: Vec::new(), pending: Vec::new(), at: 0, ctx, scratch: Vec::new(), id: next_id() }
    }

    pub fn reset(&mut self, m: &Mtp) {
        self.kv = m.new_kv(self.ctx);
        self.clear();
    }

    fn clear(&mut self) {
        self.ready_h.clear();
        self.ready_t.clear();
        self.pending.clear();
        self.at = 0;
    }

    /// Ready to draft the token after main position `pos`'s input.
    pub fn ready(&self, pos: usize) -> bool { !self.pending.is_empty() && self.at == pos }

    /// After the main model consumed `tokens` ending at position `pos` (exclusive) with hidden rows
    /// `hidden`: queues the pairs (hidden of i, token i+1) that became complete and keeps the last row
    /// pending; runs the queue now unless `defer`. A gap (the main state moved without us, e.g. a
    /// restored snapshot) restarts the drafter's cache: only draft quality depends on it, never the output.
    pub(crate) fn observe(&mut self, d: &mut Drafter<'_>, main: &ds4_model::Stage, hidden: &[f32], tokens: &[u32], pos: usize, defer: bool) -> Result<(), EngineError> {
        let n = tokens.len();
        let hd = main.cfg.hc_dim();
        if n == 0 {
            return Ok(());
        }
        let start = pos - n;
        if self.at == start {
            // With nothing pending, the pair ending at `start` was run by a draft (or this is the start).
            if !self.pending.is_empty() {
                self.ready_h.extend_from_slice(&self.pending);
                self.ready_t.push(tokens[0]);
            }
        } else {
            self.kv = d.new_kv(self.ctx);
            self.clear();
        }
        self.ready_h.extend_from_slice(&hidden[..(n - 1) * hd]);
        self.ready_t.extend_from_slice(&tokens[1..]);
        self.pending.clear();
        self.pending.extend_from_slice(&hidden[(n - 1) * hd..n * hd]);
        self.at = pos;
        if !defer {
            self.flush(d, main)?;
        }
        Ok(())
    }

    /// Runs the queued pairs through the block.
    fn flush(&mut self, d: &mut Drafter<'_>, main: &ds4_model::Stage) -> Result<(), EngineError> {
        if self.ready_t.is_empty() {
            return Ok(());
        }
        if self.kv.pos + self.ready_t.len() > self.kv.ctx {
            // Full: start over (relative positions are all the window-only block sees).
            self.kv = d.new_kv(self.ctx);
            let hd = main.cfg.hc_dim();
            let keep = self.ready_t.len().min(self.ctx);
            self.ready_h.drain(..(self.ready_t.len() - keep) * hd);
            self.ready_t.drain(..self.ready_t.len() - keep);
        }
        d.forward(main, self.id, &mut self.kv, &self.ready_h, &self.ready_t, false)?;
        self.ready_h.clear();
        self.ready_t.clear();
        Ok(())
    }

    /// The first draft step: the queued pairs and (pending row, `tok`) in one pass of the block; returns
    /// the logits of the token after `tok`. Consumes the pending row.
    pub(crate) fn first_draft<'a>(&mut self, d: &'a mut Drafter<'_>, main: &ds4_model::Stage, tok: u32) -> Result<&'a [f32], EngineError> {
        if self.kv.pos + self.ready_t.len() + 1 > self.kv.ctx {
            self.flush(d, main)?;
        }
        self.ready_h.extend_from_slice(&self.pending);
        self.ready_t.push(tok);
        self.pending.clear();
        let r = d.forward(main, self.id, &mut self.kv, &self.ready_h, &self.ready_t, true);
        self.ready_h.clear();
        self.ready_t.clear();
        r
    }
}

/// Whether the drafter's logits `l` make a draft: its top logit leads the second by at least
/// `margin`; then `q` is the distribution the draft is drawn from.
fn judge(l: &[f32], margin: f32, sampler: &mut dyn SpecSampler, q: &mut Vec<(u32, f32)>) -> bool {
    let (top, first, second) = ds4_tokenizer::sampling::top_two(l);
    if first - second < margin {
        return false;
    }
    sampler.proposal_top(l, top, q);
    true
}

impl crate::session::Session {
    /// True when generation on this session can draft with MTP (the engine has a drafter).
    pub fn speculative(&self) -> bool { self.mtp.is_some() }

    /// `generate` with MTP speculation: the same contract (`on_token` sees every token in order and may
    /// stop; `eos` stops without being fed; `stats` gains `drafted`/`accepted`), the same output for
    /// greedy and the same output distribution for sampling. Falls back to plain steps where no draft
    /// can be made (no pending hidden row, no room in the context or the token budget).
    #[allow(clippy::too_many_arguments)]
    pub fn generate_speculative(
        &mut self,
        engine: &mut crate::engine::Engine,
        max_tokens: usize,
        eos: Option<u32>,
        sampler: &mut dyn SpecSampler,
        on_token: &mut dyn FnMut(u32) -> bool,
        cancel: &std::sync::atomic::AtomicBool,
        stats: &mut crate::session::GenStats,
    ) -> Result<crate::session::StopReason, EngineError> {
        if self.logits.is_empty() {
            return Err(EngineError::Invalid("nothing to continue from: empty prompt".into()));
        }
        if engine.mtp.is_none() || self.mtp.is_none() {
            return Err(EngineError::Invalid("speculative generation needs an engine loaded with --mtp".into()));
        }
        ds4_model::residency::set_phase(ds4_model::residency::Phase::Decode);
        let t0 = std::time::Instant::now();
        let mut kept = Held::Host;
        let held = &mut kept;
        // The loop, in a closure so that every way out (an error included) comes back here.
        let result = (|| -> Result<crate::session::StopReason, EngineError> {
            use crate::session::StopReason;
            use std::sync::atomic::Ordering;
            let v = engine.cfg().n_vocab;
            let hd = engine.cfg().hc_dim();
            let (kmax, margin) = {
                let o = &engine.mtp.as_ref().expect("checked").opts;
                (o.draft, o.margin)
            };
            let mut emitted = 0usize;
            let mut next: Option<u32> = None;
            let mut drafts: Vec<u32> = Vec::with_capacity(kmax);
            let mut qs: Vec<Vec<(u32, f32)>> = vec![Vec::new(); kmax];
            let mut p: Vec<(u32, f32)> = Vec::new();
            let mut batch: Vec<u32> = Vec::with_capacity(kmax + 1);
            let mut rows: Vec<f32> = Vec::new();
            let mut hidden: Vec<f32> = Vec::new();
            let mut picks: Vec<(u32, f32)> = Vec::with_capacity(kmax + 1);
            loop {
                if emitted >= max_tokens {
                    break Ok(StopReason::MaxTokens);
                }
                if cancel.load(Ordering::Relaxed) {
                    break Ok(StopReason::Cancelled);
                }
                // Greedy on a GPU backend: the device picks the tokens; the logits stay there.
                let greedy = sampler.greedy() && engine.backend().is_gpu();
                if !greedy && *held != Held::Host {
                    // No longer greedy (the sampler switched): the device's pick does not stand.
                    self.fetch_held(engine, held)?;
                    next = None;
                }
                let tok = match next.take() {
                    Some(t) => t,
                    None => sampler.pick(&self.logits),
                };
                stats.gen_tokens += 1;
                emitted += 1;
                if Some(tok) == eos {
                    break Ok(StopReason::Eos);
                }
                if !on_token(tok) {
                    break Ok(StopReason::Caller);
                }
                if self.tokens.len() >= engine.ctx {
                    break Ok(StopReason::ContextFull);
                }
                let room = kmax.min(max_tokens - emitted).min(engine.ctx - self.tokens.len() - 1);
                let ready = self.mtp.as_ref().is_some_and(|s| s.ready(self.kv.pos));
                if room == 0 || !ready {
                    next = self.plain_step(engine, tok, greedy, held)?;
                    continue;
                }
                // Draft: the pending pair (hidden of the last position, tok), then recursively on the block's
                // own output, while the draft is confident enough.
                drafts.clear();
                let st = self.mtp.as_mut().expect("checked");
                let me = engine.mtp.as_mut().expect("checked");
                let mut dr = me.drafter();
                // Each draft judged on the drafter's logits where they are (no copy of the row).
                let mut more = judge(st.first_draft(&mut dr, &engine.stage, tok)?, margin, sampler, &mut qs[0]);
                // Rows up to here are kept; the recursive drafts' rows are rolled back after verification.
                let base = st.kv.pos;
                dr.begin_journal(&mut st.kv)?;
                for i in 0..room {
                    if !more {
                        break;
                    }
                    let d = draw(&qs[i], if qs[i].len() == 1 { 0.0 } else { sampler.uniform() });
                    drafts.push(d);
                    if i + 1 == room {
                        break;
                    }
                    more = judge(dr.forward_own(&engine.stage, st.id, &mut st.kv, d)?, margin, sampler, &mut qs[i + 1]);
                }
                dr.rollback(st.id, &mut st.kv, base)?;
                dr.end_journal(&mut st.kv);
                let k = drafts.len();
                if k == 0 {
                    next = self.plain_step(engine, tok, greedy, held)?;
                    continue;
                }
                // Verify tok and the drafts in one forward of the main model.
                batch.clear();
                batch.push(tok);
                batch.extend_from_slice(&drafts);
                let p0 = self.kv.pos;
                engine.kv_begin_journal(&mut self.kv)?;
                let r = if greedy {
                    engine.forward_picks(&mut self.kv, &batch).map(|p| {
                        picks.clear();
                        picks.extend_from_slice(p.unwrap_or_default());
                    })
                } else {
                    engine.forward(&mut self.kv, &batch, None, ds4_model::Logits::All).map(|l| {
                        rows.clear();
                        rows.extend_from_slice(l);
                    })
                };
                let r = r.and_then(|()| {
                    hidden.clear();
                    hidden.extend_from_slice(engine.hidden(k + 1)?);
                    Ok(())
                });
                if let Err(e) = r {
                    engine.kv_end_journal(&mut self.kv);
                    return Err(e);
                }
                stats.drafted += k;
                let mut fed = 1;
                let mut stop = None;
                for i in 0..k {
                    if greedy {
                        p.clear();
                        p.push((picks[i].0, 1.0));
                    } else {
                        sampler.target(&rows[i * v..(i + 1) * v], &mut p);
                    }
                    let mut u = || sampler.uniform();
                    let d = match accept(&p, &qs[i], drafts[i], &mut u) {
                        Ok(d) => d,
                        Err(t) => {
                            next = Some(t);
                            break;
                        }
                    };
                    stats.accepted += 1;
                    stats.gen_tokens += 1;
                    emitted += 1;
                    if Some(d) == eos {
                        stop = Some(StopReason::Eos);
                        break;
                    }
                    if !on_token(d) {
                        stop = Some(StopReason::Caller);
                        break;
                    }
                    fed += 1;
                }
                engine.kv_rollback(&mut self.kv, p0 + fed)?;
                engine.kv_end_journal(&mut self.kv);
                self.tokens.extend_from_slice(&batch[..fed]);
                if greedy {
                    // The last kept row's pick is the next token (a rejected draft's replacement is it too).
                    *held = Held::Row(fed - 1);
                    if stop.is_none() {
                        next = Some(picks[fed - 1].0);
                    }
                } else {
                    *held = Held::Host;
                    self.logits.clear();
                    self.logits.extend_from_slice(&rows[(fed - 1) * v..fed * v]);
                }
                let st = self.mtp.as_mut().expect("checked");
                let me = engine.mtp.as_mut().expect("checked");
                st.observe(&mut me.drafter(), &engine.stage, &hidden[..fed * hd], &batch[..fed], self.kv.pos, true)?;
                if let Some(s) = stop {
                    break Ok(s);
                }
            }
        })();
        // The last token's logits where the device kept them (unknown after an error: none).
        let fetched = match (&result, kept) {
            (Err(_), Held::Row(_) | Held::Last) => {
                self.logits.clear();
                Ok(())
            }
            (_, Held::Host) => Ok(()),
            (Ok(_), Held::Row(r)) => engine.logits_row(r, &mut self.logits),
            (Ok(_), Held::Last) => engine.last_logits(&mut self.logits),
        };
        stats.gen_time += t0.elapsed();
        let r = result?;
        fetched.map(|()| r)
    }

    /// One plain decode step of `tok` (no draft could be made): the next token when the device
    /// picked it (greedy), else None with the logits in `self.logits`.
    fn plain_step(&mut self, engine: &mut crate::engine::Engine, tok: u32, greedy: bool, held: &mut Held) -> Result<Option<u32>, EngineError> {
        if greedy {
            if let Some((t, _)) = engine.forward_top1(&mut self.kv, std::slice::from_ref(&tok), None)? {
                self.tokens.push(tok);
                *held = Held::Last;
                self.mtp_observe(engine, std::slice::from_ref(&tok))?;
                return Ok(Some(t));
            }
        }
        self.step(engine, tok)?;
        *held = Held::Host;
        Ok(None)
    }

    /// Brings the logits the device kept into `self.logits`.
    fn fetch_held(&mut self, engine: &mut crate::engine::Engine, held: &mut Held) -> Result<(), EngineError> {
        match *held {
            Held::Host => {}
            Held::Row(r) => engine.logits_row(r, &mut self.logits)?,
            Held::Last => engine.last_logits(&mut self.logits)?,
        }
        *held = Held::Host;
        Ok(())
    }
}

/// Where the logits after the last fed token are: in `Session::logits`, or still on the device (row
/// r of the last verify step, or the last decode step's).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Held {
    Host,
    Row(usize),
    Last,
}
