//! Live KV reuse (spec §5.7). One live session; a new prompt is matched against it in this order:
//! 1. token prefix: the prompt extends (or equals) the live tokens → prefill only the suffix;
//! 2. rendered-text prefix: the live tokens decode to a prefix of the new rendered prompt → keep them and
//!    tokenize only the text suffix (covers tokenizations that differ at the boundary);
//! 3. snapshot: the longest kept snapshot whose tokens prefix the prompt is restored (KV state cannot be
//!    truncated in place — ring window and compressor state — so rewinds go through copies);
//! 4. disk (`--kv-disk-dir`): the longest cached prefix on disk, when longer than the best snapshot;
//! 5. cold prefill.
//!
//! With a disk cache, the live state is saved before an unrelated prompt (sharing less than half of it)
//! replaces it, while prefilling a cold prompt (at its trimmed, aligned length) and at every
//! `--kv-cache-continued-interval-tokens` frontier (`disk::SavePolicy`).
//!
//! Snapshots are taken while prefilling, at the start of the first and last user turns (shared system
//! prompt, edited last message) and at the end of the prompt (regenerate), bounded in number (LRU).
use crate::disk::DiskCache;
use ds4_engine::{Engine, EngineError, Session};
use ds4_kvstore::Reason;
use ds4_model::KvState;
use ds4_tokenizer::Tokenizer;
use std::sync::atomic::AtomicBool;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    Extend,
    Exact,
    TextPrefix,
    Snapshot,
    Disk,
    Cold,
}

impl Decision {
    pub fn name(self) -> &'static str {
        match self {
            Decision::Extend => "extend",
            Decision::Exact => "exact",
            Decision::TextPrefix => "text-prefix",
            Decision::Snapshot => "snapshot",
            Decision::Disk => "disk",
            Decision::Cold => "cold",
        }
    }
}

struct Snapshot {
    tokens: Vec<u32>,
    kv: KvState,
    logits: Vec<f32>,
    last_used: u64,
}

pub struct LiveKv {
    pub session: Session,
    snaps: Vec<Snapshot>,
    max_snaps: usize,
    clock: u64,
    pub disk: Option<DiskCache>,
}

#[derive(Debug, Clone)]
pub struct Prepared {
    /// The prompt actually in the session (differs from the request's tokens after a text-prefix match).
    pub prompt: Vec<u32>,
    pub cached: usize,
    pub prefilled: usize,
    pub decision: Decision,
    /// Longest common token prefix with the live session before the request (for the miss log).
    pub live_common: usize,
    pub live_len: usize,
}

fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

impl LiveKv {
    pub fn new(session: Session, max_snaps: usize) -> Self {
        Self { session, snaps: Vec::new(), max_snaps, clock: 0, disk: None }
    }

    pub fn snapshot_count(&self) -> usize {
        self.snaps.len()
    }

    pub fn snapshot_bytes(&self) -> usize {
        self.snaps.iter().map(|s| s.kv.bytes() + s.logits.len() * 4 + s.tokens.len() * 4).sum()
    }

    /// Prompt tokens this state could serve without prefilling: the live tokens when the prompt extends
    /// them, else the longest snapshot that prefixes it (a partly shared live state cannot be cut back).
    pub fn reusable_prefix(&self, prompt: &[u32]) -> usize {
        let s = &self.session;
        let live = if !s.tokens.is_empty() && !s.logits.is_empty() && prompt.starts_with(&s.tokens) { s.tokens.len() } else { 0 };
        let snap = self.snaps.iter().filter(|x| prompt.starts_with(&x.tokens)).map(|x| x.tokens.len()).max().unwrap_or(0);
        live.max(snap)
    }

    /// True when the state holds nothing (a fresh session).
    pub fn is_empty(&self) -> bool {
        self.session.tokens.is_empty() && self.snaps.is_empty()
    }

    /// Saves the live session to disk (clean shutdown).
    pub fn save_to_disk(&mut self, engine: &mut Engine, tok: &Tokenizer, reason: Reason) {
        if let Some(disk) = self.disk.as_mut() {
            disk.save(&mut self.session, engine, tok, reason);
        }
    }

    /// Forgets everything (after an engine failure left the state unknown).
    pub fn reset(&mut self, engine: &Engine) {
        self.session.reset(engine);
        self.snaps.clear();
    }

    fn take_snapshot(&mut self) {
        if self.max_snaps == 0 || self.session.logits.is_empty() {
            return;
        }
        self.clock += 1;
        if let Some(s) = self.snaps.iter_mut().find(|s| s.tokens == self.session.tokens) {
            s.last_used = self.clock;
            return;
        }
        if self.snaps.len() >= self.max_snaps {
            if let Some(i) = self.snaps.iter().enumerate().min_by_key(|(_, s)| s.last_used).map(|(i, _)| i) {
                self.snaps.swap_remove(i);
            }
        }
        self.snaps.push(Snapshot {
            tokens: self.session.tokens.clone(),
            kv: self.session.kv.clone(),
            logits: self.session.logits.clone(),
            last_used: self.clock,
        });
    }

    /// Chooses how to reuse state for `prompt` (see module docs) and prefills what is missing, taking
    /// snapshots at `points` (token positions) on the way. `rendered` is the prompt's text, for the
    /// text-prefix match. On error the session is left consistent (tokens match the KV state).
    #[allow(clippy::too_many_arguments)]
    pub fn prepare(
        &mut self,
        engine: &mut Engine,
        tok: &Tokenizer,
        prompt: Vec<u32>,
        rendered: Option<&str>,
        points: &[usize],
        progress: &mut dyn FnMut(usize, usize),
        cancel: &AtomicBool,
    ) -> Result<Prepared, EngineError> {
        let prep = self.choose(engine, tok, prompt, rendered);
        let end = prep.prompt.len();
        self.prefill_to(engine, tok, &prep, points, end, progress, cancel)?;
        Ok(prep)
    }

    /// The first half of `prepare`: picks the reuse (restoring a snapshot or a disk entry, or starting
    /// over) and says what is left to prefill; nothing is prefilled yet.
    pub fn choose(&mut self, engine: &mut Engine, tok: &Tokenizer, mut prompt: Vec<u32>, rendered: Option<&str>) -> Prepared {
        let live_len = self.session.tokens.len();
        let live_common = common_prefix(&self.session.tokens, &prompt);
        let have_live = live_len > 0 && !self.session.logits.is_empty();
        let mut decision = Decision::Cold;
        if have_live && live_common == live_len {
            decision = if prompt.len() == live_len { Decision::Exact } else { Decision::Extend };
        } else if let (true, Some(text)) = (have_live, rendered) {
            let live_text = tok.decode(&self.session.tokens);
            if !live_text.contains('\u{FFFD}') && text.len() > live_text.len() && text.starts_with(&live_text) {
                let suffix = tok.encode(&text[live_text.len()..]);
                // The live tokens may take more of the context than the request's own tokenization
                // (which was checked to fit): such a prompt would fail the prefill (500), or leave no
                // room for a reply token (an empty 200). The request's own tokens are used instead.
                if !suffix.is_empty() && live_len + suffix.len() < engine.ctx {
                    prompt = self.session.tokens.clone();
                    prompt.extend(suffix);
                    decision = Decision::TextPrefix;
                }
            }
        }
        if decision == Decision::Cold {
            self.clock += 1;
            let best = self
                .snaps
                .iter()
                .enumerate()
                .filter(|(_, s)| s.tokens.len() <= prompt.len() && prompt.starts_with(&s.tokens))
                .max_by_key(|(_, s)| s.tokens.len())
                .map(|(i, s)| (i, s.tokens.len()));
            let mut from_disk = false;
            if let Some(disk) = self.disk.as_mut() {
                let entry = disk.find(&prompt, best.map_or(0, |b| b.1));
                // The live state is about to be replaced: keep it on disk when the new prompt is another
                // conversation (shares less than half of it).
                if have_live && live_common * 2 < live_len {
                    disk.save(&mut self.session, engine, tok, Reason::Evict);
                }
                if let Some(e) = entry {
                    from_disk = disk.restore(&e, &mut self.session, engine);
                }
            }
            if from_disk {
                decision = Decision::Disk;
            } else if let Some((i, _)) = best {
                let s = &mut self.snaps[i];
                s.last_used = self.clock;
                self.session.kv = s.kv.clone();
                self.session.tokens = s.tokens.clone();
                self.session.logits = s.logits.clone();
                decision = Decision::Snapshot;
            } else {
                self.session.reset(engine);
            }
        }
        let cached = self.session.tokens.len();
        let total = prompt.len() - cached;
        Prepared { prompt, cached, prefilled: total, decision, live_common, live_len }
    }

    /// The second half of `prepare`: prefills `prep.prompt` from where the session is up to `end` (at
    /// most the prompt's length), taking snapshots at `points` and disk saves on the way. Called
    /// repeatedly with growing `end`, it prefills a long prompt in slices.
    #[allow(clippy::too_many_arguments)]
    pub fn prefill_to(
        &mut self,
        engine: &mut Engine,
        tok: &Tokenizer,
        prep: &Prepared,
        points: &[usize],
        end: usize,
        progress: &mut dyn FnMut(usize, usize),
        cancel: &AtomicBool,
    ) -> Result<(), EngineError> {
        let (prompt, cached, decision, total) = (&prep.prompt, prep.cached, prep.decision, prep.prefilled);
        let end = end.min(prompt.len());
        let mut done_before = self.session.tokens.len().saturating_sub(cached);
        // Disk saves while prefilling (`SavePolicy`): a cold prompt at its trimmed, aligned length; any
        // prefill at the interval frontiers it crosses.
        let mut saves: Vec<(usize, Reason)> = Vec::new();
        if let Some(disk) = self.disk.as_ref() {
            let pol = disk.policy;
            if decision == Decision::Cold && cached == 0 {
                if let Some(p) = pol.cold_point(prompt.len()) {
                    saves.push((p, Reason::Cold));
                }
            }
            for p in pol.continued_points(cached, prompt.len()) {
                if !saves.iter().any(|s| s.0 == p) {
                    saves.push((p, Reason::Continued));
                }
            }
        }
        let mut stops: Vec<usize> = points.iter().copied().chain(saves.iter().map(|s| s.0)).filter(|&p| p > self.session.tokens.len() && p < end).collect();
        stops.sort_unstable();
        stops.dedup();
        stops.push(end);
        for p in stops {
            if p > self.session.tokens.len() {
                let base = done_before;
                let r = self.session.sync(engine, &prompt[..p], &mut |d, _| progress(base + d, total), cancel);
                match r {
                    Ok(n) => done_before += n,
                    Err(e) => {
                        // A cancelled prefill stops between chunks: tokens and KV still agree. Anything
                        // else may have left a half-written chunk: start over next time.
                        if !cancel.load(std::sync::atomic::Ordering::Relaxed) {
                            self.session.reset(engine);
                        }
                        return Err(e);
                    }
                }
            }
            if points.contains(&p) || p == prompt.len() {
                self.take_snapshot();
            }
            if let (Some(disk), Some(&(_, reason))) = (self.disk.as_mut(), saves.iter().find(|s| s.0 == p)) {
                disk.save(&mut self.session, engine, tok, reason);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ds4_engine::{resolve_model, LoadOptions};

    fn engine(ctx: usize) -> Engine {
        let src = resolve_model(None).expect("embedded model");
        let opts = LoadOptions { ctx, prefill_chunk: 16, quiet: true, ..LoadOptions::default() };
        Engine::load(src.path(), &opts).expect("load")
    }

    /// A live state whose tokens spell a prefix of the new rendered prompt with more tokens than the
    /// prompt's own tokenization (the model sampled a word piece by piece) must not be reused when that
    /// would not fit the context: the request's own tokens (which fit) are prefilled instead.
    #[test]
    fn text_prefix_reuse_never_outgrows_the_context() {
        let big = engine(256);
        let tok = big.tokenizer().expect("tokenizer");
        let head = "hello world, this is the shared beginning";
        let tail = " and the new part";
        let text = format!("{head}{tail}");
        // The head one character per token: the same text, many more tokens than `encode(head)`.
        let pieces: Vec<u32> = head.chars().flat_map(|c| tok.encode(&c.to_string())).collect();
        assert_eq!(tok.decode(&pieces), head);
        let prompt = tok.encode(&text);
        // The reused prompt (the pieces, then the tail) exactly fills the context; the request's own fits.
        let ctx = pieces.len() + tok.encode(tail).len();
        assert!(prompt.len() < ctx && pieces.len() < ctx, "{} {} {ctx}", prompt.len(), pieces.len());
        let mut eng = engine(ctx);
        let mut live = LiveKv::new(Session::new(&eng), 0);
        live.session.tokens = pieces.clone();
        live.session.logits = vec![0.0; eng.cfg().n_vocab];
        let prep = live.choose(&mut eng, &tok, prompt.clone(), Some(&text));
        assert_ne!(prep.decision, Decision::TextPrefix);
        assert!(prep.prompt.len() < ctx, "prompt of {} tokens for a context of {ctx}", prep.prompt.len());
        assert_eq!(prep.prompt, prompt);

        // With room to spare the same state is reused by text prefix (the path itself still works).
        let mut eng = big;
        let mut live = LiveKv::new(Session::new(&eng), 0);
        live.session.tokens = pieces.clone();
        live.session.logits = vec![0.0; eng.cfg().n_vocab];
        let prep = live.choose(&mut eng, &tok, prompt.clone(), Some(&text));
        assert_eq!(prep.decision, Decision::TextPrefix);
        assert!(prep.prompt.starts_with(&pieces));
    }
}
