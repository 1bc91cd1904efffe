//! A multi-turn conversation kept as tokens, so each turn only prefills what is new; one turn's
//! prefill, generation, display (reasoning apart from the answer, or per-token logprobs) and stats.
use crate::conversation::Conversation;
use crate::logprobs::{self, Step};
use ds4_engine::power::Power;
use crate::reasoning_view::ReasoningView;
use ds4_engine::{GenStats, StopReason};
use ds4_tokenizer::chat::{render_chat, Message, RenderOptions, ThinkMode};
use ds4_tokenizer::sampling::{argmax, Sampler, SamplerConfig};
use ds4_tokenizer::StreamDecoder;
use indicatif::{ProgressBar, ProgressStyle};
use std::cell::RefCell;
use std::io::{IsTerminal, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

/// How a turn's output is shown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Display {
    /// Reasoning (indented, dim on a terminal), then the answer.
    Text,
    /// One JSON line per generated token with its logprob and the top N alternatives.
    Logprobs(usize),
}

/// Chat settings that come from the command line.
pub struct ChatConfig {
    pub mode: ThinkMode,
    pub system: Option<String>,
    /// Earlier turns the conversation starts from (`--prefix-file`).
    pub prefix: Vec<Message>,
    pub sampler: SamplerConfig,
    pub max_tokens: usize,
    /// Tokenize the prompt as written, without chat markers (`--raw-prompt`).
    pub raw: bool,
    pub display: Display,
    /// Keep every step's logprobs with this many alternatives (for `--dump-logprobs`).
    pub record_top_k: Option<usize>,
    pub power: u32,
    pub debug: bool,
}

/// What a turn did.
#[derive(Debug, Default)]
pub struct TurnStats {
    pub gen: GenStats,
    /// Tokens the prefill had to process (the prompt minus what the conversation already held).
    pub prefill_todo: usize,
    pub prefill_interrupted: bool,
    pub stop: Option<StopReason>,
}

pub struct Chat {
    pub mode: ThinkMode,
    system: Option<String>,
    prefix: Vec<Message>,
    sampler: Sampler,
    greedy: bool,
    max_tokens: usize,
    raw: bool,
    display: Display,
    record_top_k: Option<usize>,
    /// Steps recorded for `--dump-logprobs` (all turns).
    pub recorded: Vec<Step>,
    power: Power,
    debug: bool,
    /// The Think Max fallback warning was printed for the current mode.
    max_warned: bool,
}

impl Chat {
    pub fn new(c: ChatConfig, n_vocab: usize) -> Result<Self, String> {
        let s = c.sampler;
        let greedy = s.temperature.is_nan() || s.temperature <= 0.0 || s.top_k == 1;
        Ok(Self {
            mode: c.mode,
            system: c.system,
            prefix: c.prefix,
            sampler: Sampler::with_capacity(s, n_vocab),
            greedy,
            max_tokens: c.max_tokens,
            raw: c.raw,
            display: c.display,
            record_top_k: c.record_top_k,
            recorded: Vec::new(),
            power: Power::new(c.power)?,
            debug: c.debug,
            max_warned: false,
        })
    }

    /// A new thinking mode (from an interactive command): its fallback warning may show again.
    pub fn set_mode(&mut self, m: ThinkMode) {
        self.mode = m;
        self.max_warned = false;
    }

    /// `/power N`: a new duty-cycle target.
    pub fn set_power(&mut self, pct: u32) -> Result<(), String> {
        self.power = Power::new(pct)?;
        Ok(())
    }

    /// The caller already said that Think Max falls back (no second warning at the next turn).
    pub fn mark_max_warned(&mut self) { self.max_warned = true; }

    /// The tokens of a conversation's first turn: system prompt, `--prefix-file` turns, the user's text.
    pub fn first_turn_tokens(&self, tok: &ds4_tokenizer::Tokenizer, ctx: usize, user: &str) -> Vec<u32> {
        if self.raw || user.starts_with(ds4_tokenizer::special::BOS) {
            // Raw, or already a rendered chat (as ds4): tokenized as written.
            return tok.encode(user);
        }
        let mut msgs = Vec::new();
        if let Some(s) = self.system.as_deref().filter(|s| !s.is_empty()) {
            msgs.push(Message::system(s.to_string()));
        }
        msgs.extend(self.prefix.iter().cloned());
        msgs.push(Message::user(user.to_string()));
        tok.encode(&render_chat(&msgs, &RenderOptions { mode: self.mode, ctx: ctx as u64, ..RenderOptions::default() }))
    }

    /// Renders the next user turn as tokens appended to the conversation.
    pub fn prompt_tokens(&self, conv: &dyn Conversation, user: &str) -> Result<Vec<u32>, String> {
        let tok = conv.tokenizer();
        let ids = tok.chat_ids().map_err(|e| e.to_string())?;
        if self.raw {
            let mut t = conv.tokens().to_vec();
            t.extend(tok.encode(user));
            return Ok(t);
        }
        if conv.tokens().is_empty() {
            return Ok(self.first_turn_tokens(&tok, conv.ctx(), user));
        }
        // Later turns: the previous answer is closed with EOS, then a new user turn opens the reply.
        let mut t = conv.tokens().to_vec();
        if t.last() != Some(&ids.eos) {
            t.push(ids.eos);
        }
        let opener = if self.mode.effective(conv.ctx() as u64).thinking() { "<think>" } else { "</think>" };
        t.extend(tok.encode(&format!("<｜User｜>{user}<｜Assistant｜>{opener}")));
        Ok(t)
    }

    /// Prefills the prompt. Returns false when Ctrl+C stopped it (the conversation is then reset).
    fn prefill(&mut self, conv: &mut dyn Conversation, prompt: &[u32], cancel: &AtomicBool, st: &mut TurnStats) -> Result<bool, String> {
        let todo = prompt.len() - common_prefix(conv.tokens(), prompt);
        st.prefill_todo = todo;
        let bar = (todo > conv.prefill_chunk()).then(|| {
            let b = ProgressBar::new(todo as u64);
            b.set_style(ProgressStyle::with_template("prefill {bar:40} {pos}/{len} tokens ({per_sec})").unwrap());
            b
        });
        let mut done = 0;
        let power = &mut self.power;
        power.restart();
        let t0 = Instant::now();
        let res = conv.sync(
            prompt,
            &mut |d, _| {
                done = d;
                if let Some(b) = &bar {
                    b.set_position(d as u64);
                }
                power.tick();
            },
            cancel,
        );
        if let Some(b) = bar {
            b.finish_and_clear();
        }
        st.gen.prefill_time = t0.elapsed();
        match res {
            Ok(n) => {
                st.gen.prefilled_tokens = n;
                Ok(true)
            }
            Err(e) => {
                conv.reset();
                if !cancel.load(Ordering::SeqCst) {
                    return Err(e);
                }
                // The tokens processed before Ctrl+C, for honest stats.
                st.gen.prefilled_tokens = done;
                st.prefill_interrupted = true;
                Ok(false)
            }
        }
    }

    pub fn turn(&mut self, conv: &mut dyn Conversation, user: &str, cancel: &AtomicBool, generating: &AtomicBool) -> Result<TurnStats, String> {
        let ctx = conv.ctx();
        if self.mode == ThinkMode::Max && self.mode.effective(ctx as u64) != ThinkMode::Max && !self.max_warned {
            eprintln!("ds4: --think-max needs --ctx >= 393216; using normal thinking");
            self.max_warned = true;
        }
        let prompt = self.prompt_tokens(conv, user)?;
        if prompt.len() >= ctx {
            return Err(format!("prompt has {} tokens, which does not fit --ctx {ctx}", prompt.len()));
        }
        let mut st = TurnStats { gen: GenStats { prompt_tokens: prompt.len(), ..GenStats::default() }, ..TurnStats::default() };
        cancel.store(false, Ordering::SeqCst);
        generating.store(true, Ordering::SeqCst);
        let r = self.prefill(conv, &prompt, cancel, &mut st).and_then(|ok| if ok { self.generate(conv, cancel, &mut st) } else { Ok(()) });
        generating.store(false, Ordering::SeqCst);
        r?;
        if st.prefill_interrupted {
            eprintln!("\n[prefill interrupted after {} of {} tokens]", st.gen.prefilled_tokens, st.prefill_todo);
        }
        match st.stop {
            Some(StopReason::Cancelled) => eprintln!("[generation interrupted]"),
            Some(StopReason::MaxTokens) => eprintln!("ds4: generation stopped at the -n limit ({} tokens)", self.max_tokens),
            Some(StopReason::ContextFull) => eprintln!("ds4: generation stopped: the context (--ctx {ctx}) is full"),
            _ => {}
        }
        if self.debug {
            eprintln!("ds4: stop reason {:?}, session {} tokens", st.stop, conv.tokens().len());
            if conv.speculative() {
                let g = &st.gen;
                eprintln!("ds4: mtp drafted {} accepted {} (acceptance {:.3})", g.drafted, g.accepted, g.acceptance());
            }
        }
        Ok(st)
    }

    fn generate(&mut self, conv: &mut dyn Conversation, cancel: &AtomicBool, st: &mut TurnStats) -> Result<(), String> {
        let tok = conv.tokenizer();
        let ids = tok.chat_ids().map_err(|e| e.to_string())?;
        // The reply is reasoning first when the prompt opened it.
        let thinking = conv.tokens().last() == Some(&ids.think_start);
        let stdout = std::io::stdout();
        let mut view = ReasoningView::new(thinking, stdout.is_terminal());
        let mut dec = StreamDecoder::new();
        let mut out = stdout.lock();
        // A failed write to stdout (a closed pipe, a full disk) stops the generation; a full disk fails the turn.
        let write_err: RefCell<Option<std::io::Error>> = RefCell::new(None);
        let failed = |r: std::io::Result<()>| {
            if let Err(e) = r {
                write_err.borrow_mut().get_or_insert(e);
            }
        };
        let top_k = match self.display {
            Display::Logprobs(k) => Some(k.max(self.record_top_k.unwrap_or(0))),
            Display::Text => self.record_top_k,
        };
        // Logprobs need the host logits of every step: the device-side argmax is not used then.
        let device_greedy = self.greedy && top_k.is_none();
        let steps = RefCell::new(Vec::new());
        let (sampler, greedy, display, debug) = (&mut self.sampler, self.greedy, self.display, self.debug);
        let first = self.recorded.len();
        let power = &mut self.power;
        power.restart();
        let mut on_token = |t: u32| {
            if display == Display::Text {
                let piece = if t == ids.think_end {
                    dec.finish() + &view.think_end()
                } else if t == ids.think_start {
                    dec.finish() + &view.think_start()
                } else if tok.is_added(t) {
                    view.text(&(dec.finish() + &tok.token_text(t)))
                } else {
                    view.text(&dec.push(&tok, t))
                };
                failed(out.write_all(piece.as_bytes()).and_then(|()| out.flush()));
            }
            if debug {
                // Weight residency operations so far in this phase: stays 0 after load.
                let c = ds4_model::residency::snapshot();
                use ds4_model::residency::{Op, Phase};
                eprintln!("[debug] token {t}: decode map={} bind={} upload={}", c.get(Phase::Decode, Op::Map), c.get(Phase::Decode, Op::Bind), c.get(Phase::Decode, Op::Upload));
            }
            power.tick();
            write_err.borrow().is_none()
        };
        // MTP: the sampler itself gives the distributions (logprob output is refused with --mtp).
        let reason = if conv.speculative() && top_k.is_none() {
            conv.generate_speculative(self.max_tokens, ids.eos, sampler, &mut on_token, cancel, &mut st.gen)
        } else { conv.generate(
            self.max_tokens,
            ids.eos,
            device_greedy,
            &mut |l| {
                let t = if greedy { argmax(l) } else { sampler.sample(l) };
                if let Some(k) = top_k {
                    let s = logprobs::step(l, t, k);
                    if let Display::Logprobs(n) = display {
                        let shown = Step { chosen: s.chosen, top: s.top[..n.min(s.top.len())].to_vec() };
                        failed(writeln!(std::io::stdout(), "{}", logprobs::line(&tok, first + steps.borrow().len(), &shown)));
                    }
                    steps.borrow_mut().push(s);
                }
                t
            },
            &mut on_token,
            cancel,
            &mut st.gen,
        ) };
        drop(on_token);
        if display == Display::Text {
            let rest = view.text(&dec.finish()) + &view.finish();
            failed(out.write_all(rest.as_bytes()).and_then(|()| writeln!(out)));
        }
        failed(out.flush());
        if self.record_top_k.is_some() {
            self.recorded.extend(steps.into_inner());
        }
        st.stop = Some(reason?);
        write_outcome(write_err.into_inner().map_or(Ok(()), Err), "the answer to stdout")
    }
}

/// The result of writing `what` to stdout: a failed write (a full disk) is an error; a closed pipe
/// (`ds4 -p ... | head`) is not: the reader has what it wanted.
pub fn write_outcome(r: std::io::Result<()>, what: &str) -> Result<(), String> {
    match r {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(format!("cannot write {what}: {e}")),
        _ => Ok(()),
    }
}

fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    if b.starts_with(a) { a.len() } else { 0 }
}

/// The end-of-turn line (stderr).
pub fn print_stats(s: &TurnStats) {
    let g = &s.gen;
    if s.prefill_interrupted {
        eprintln!("prompt: {} tokens, prefill {} of {} tokens at {:.2} t/s (interrupted)", g.prompt_tokens, g.prefilled_tokens, s.prefill_todo, g.prefill_tps());
        return;
    }
    eprintln!("prompt: {} tokens, prefill {:.2} t/s | generated: {} tokens, {:.2} t/s", g.prompt_tokens, g.prefill_tps(), g.gen_tokens, g.gen_tps());
}
