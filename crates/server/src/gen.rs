//! One request's generation after its prefill: picks each token (sampler, or the test script), turns
//! tokens into events (stop strings, reasoning, DSML tool calls) and reports the end (metrics, log,
//! trace, `Done`). Driven one token at a time, so the single worker and the batched scheduler share it.
use crate::errors::ApiError;
use crate::kv_reuse::Prepared;
use crate::metrics::Metrics;
use crate::tools::ToolMemory;
use crate::trace::Trace;
use crate::worker::{Event, Finish, Job, Output, Usage};
use ds4_engine::{GenStats, StopReason};
use ds4_tokenizer::sampling::{Sampler, StopMatcher, StopReason as StopHit};
use ds4_tokenizer::{ChatTokenIds, StreamDecoder, Tokenizer};
use std::sync::atomic::{Ordering::Relaxed, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub struct Gen {
    pub job: Job,
    pub seq: u64,
    tok: Arc<Tokenizer>,
    ids: ChatTokenIds,
    out: Output,
    sampler: Sampler,
    script_at: usize,
    dec: StreamDecoder,
    stopm: StopMatcher,
    stop_hit: Option<usize>,
    client_gone: bool,
    reasoning_tokens: usize,
    in_reasoning: bool,
    /// Every token is the argmax (no sampling, no script).
    pub greedy: bool,
    pub stats: GenStats,
    /// Time from queueing to the first token, once there is one.
    ttft: Option<Duration>,
    /// Alternatives per token when the request asked for logprobs, and those of the token just sampled.
    lp_top: Option<usize>,
    pending_lp: Option<ds4_engine::logprobs::Step>,
}

/// Where a finished request is reported.
pub struct Report<'a> {
    pub metrics: &'a Metrics,
    pub trace: &'a Trace,
    pub quiet: bool,
}

impl Gen {
    #[allow(clippy::too_many_arguments)]
    pub fn new(job: Job, seq: u64, tok: Arc<Tokenizer>, ids: ChatTokenIds, tool_mem: Arc<Mutex<ToolMemory>>, exact_tool_replay: bool, n_vocab: usize) -> Self {
        let sc = job.params.sampling;
        let lp_top = job.params.logprobs;
        // Logprobs need every step's logits on the host: such a request does not take the device's
        // greedy pick (the GPU keeps the logits there), it samples on the host (argmax, same tokens).
        let greedy = lp_top.is_none() && job.params.script.is_none() && (sc.temperature.is_nan() || sc.temperature <= 0.0 || sc.top_k == 1);
        let out = Output::new(&job, tool_mem, exact_tool_replay);
        let stopm = StopMatcher::new(&job.params.stops, &[]);
        let in_reasoning = job.params.thinking;
        Self {
            seq,
            tok,
            ids,
            out,
            sampler: Sampler::with_capacity(sc, n_vocab),
            script_at: 0,
            dec: StreamDecoder::new(),
            stopm,
            stop_hit: None,
            client_gone: false,
            reasoning_tokens: 0,
            in_reasoning,
            greedy,
            stats: GenStats::default(),
            ttft: None,
            lp_top,
            pending_lp: None,
            job,
        }
    }

    /// True when speculative decoding can keep this request's output: no test script and no logprobs
    /// (accepted drafts do not pass through `sample`).
    pub fn speculable(&self) -> bool { self.job.params.script.is_none() && self.lp_top.is_none() }

    /// The sampler's distribution for the next token now (greedy inside tool-call syntax).
    pub fn target(&mut self, l: &[f32], out: &mut Vec<(u32, f32)>) { self.sampler.distribution(l, self.out.in_syntax(), out) }

    /// The distribution drafts are drawn from (the request's settings).
    pub fn proposal(&mut self, l: &[f32], out: &mut Vec<(u32, f32)>) { self.sampler.distribution(l, false, out) }

    pub fn uniform(&mut self) -> f64 { self.sampler.uniform() }

    /// The next token from the logits after the last one (the script's token in test mode).
    pub fn sample(&mut self, l: &[f32]) -> u32 {
        let t = if let Some(s) = &self.job.params.script {
            let t = s.get(self.script_at).copied().unwrap_or(self.ids.eos);
            self.script_at += 1;
            t
        } else {
            self.sampler.sample_greedy_if(l, self.out.in_syntax())
        };
        if let Some(n) = self.lp_top {
            self.pending_lp = Some(ds4_engine::logprobs::step(l, t, n));
        }
        t
    }

    /// Emits token `t`; false to stop (client gone, stop string, tool-call block complete).
    pub fn on_token(&mut self, t: u32) -> bool {
        if self.job.events.is_closed() {
            self.client_gone = true;
            self.job.cancel.store(true, SeqCst);
            return false;
        }
        if self.ttft.is_none() {
            self.ttft = Some(self.job.queued.elapsed());
        }
        let reasoning = self.in_reasoning;
        if self.in_reasoning {
            self.reasoning_tokens += 1;
            self.in_reasoning = t != self.ids.think_end;
        }
        // Only tokens of the visible content get logprobs: not reasoning, not a tool-call block
        // (`Output` sends them with the text that shows them, and drops those of a block).
        if let Some(s) = self.pending_lp.take() {
            if !reasoning && !self.out.in_tool_block() {
                self.out.lp_pending.push(crate::logprobs::TokenLogprob::new(&self.tok, &s));
            }
        }
        let piece = if self.tok.is_added(t) {
            let mut p = self.dec.finish();
            p.push_str(&self.tok.token_text(t));
            p
        } else {
            self.dec.push(&self.tok, t)
        };
        let step = self.stopm.push_text(&piece);
        self.out.push(&step.emit);
        if let Some(StopHit::StopString(i)) = step.stop {
            self.stop_hit = Some(i);
            return false;
        }
        !self.out.block_done
    }

    /// Whether the request is inside its reasoning (after the tokens emitted so far).
    pub fn in_reasoning(&self) -> bool { self.in_reasoning }

    /// True once the client has gone away or cancelled.
    pub fn cancelled(&self) -> bool {
        self.job.cancel.load(Relaxed) || self.job.events.is_closed()
    }

    /// Reports the end of generation: metrics, the log line, the trace, and the final event.
    pub fn finish(mut self, r: Result<StopReason, ApiError>, rep: &Report, prep: &Prepared, prefill_time: Duration) {
        let (m, seq, kind) = (rep.metrics, self.seq, self.job.kind);
        let stats = std::mem::take(&mut self.stats);
        if let Some(t) = self.ttft {
            m.ttft_micros.fetch_add(t.as_micros() as u64, Relaxed);
            m.ttft_count.fetch_add(1, Relaxed);
            m.last_ttft_micros.store(t.as_micros() as u64, Relaxed);
        }
        let reason = match r {
            Ok(r) => r,
            Err(e) => {
                m.jobs_failed.fetch_add(1, Relaxed);
                eprintln!("ds4-server: request failed: {}", e.message);
                crate::request_log::done(rep.quiet, seq, kind, prep, prefill_time, &stats, "error");
                let _ = self.job.events.send(Event::Error(e));
                return;
            }
        };
        m.generated_tokens.fetch_add(stats.gen_tokens as u64, Relaxed);
        m.mtp_drafted.fetch_add(stats.drafted as u64, Relaxed);
        m.mtp_accepted.fetch_add(stats.accepted as u64, Relaxed);
        m.last_mtp_drafted.store(stats.drafted as u64, Relaxed);
        m.last_mtp_accepted.store(stats.accepted as u64, Relaxed);
        m.decode_micros.fetch_add(stats.gen_time.as_micros() as u64, Relaxed);
        if stats.gen_tokens > 0 && stats.gen_time.as_secs_f64() > 0.0 {
            m.last_decode_mtps.store((stats.gen_tokens as f64 / stats.gen_time.as_secs_f64() * 1000.0) as u64, Relaxed);
        }
        if self.client_gone || reason == StopReason::Cancelled {
            m.jobs_cancelled.fetch_add(1, Relaxed);
            crate::request_log::done(rep.quiet, seq, kind, prep, prefill_time, &stats, "cancelled");
            rep.trace.job(seq, &self.job, prep, "cancelled", &self.out.all_text, &stats);
            return;
        }
        if self.stop_hit.is_none() {
            let rest = self.dec.finish();
            let mut tail = self.stopm.push_text(&rest).emit;
            tail.push_str(&self.stopm.finish());
            self.out.push(&tail);
        }
        self.out.finish();
        // A block the output's end cut short (its call made up from what parsed) reports that end: the
        // token limit or a stop string, as OpenAI and Anthropic do for a call they cut; the model's own
        // end of sequence leaves it a call.
        let cut = self.out.cut_short && (self.stop_hit.is_some() || reason != StopReason::Eos);
        let finish = if self.out.block_done && !cut {
            Finish::ToolCalls
        } else if let Some(i) = self.stop_hit {
            Finish::StopSequence(i)
        } else {
            match reason {
                StopReason::Eos => Finish::Stop,
                _ => Finish::Length,
            }
        };
        if self.out.block_done {
            m.tool_calls.fetch_add(self.out.calls.len() as u64, Relaxed);
        }
        m.jobs_completed.fetch_add(1, Relaxed);
        rep.trace.job(seq, &self.job, prep, &format!("{finish:?}"), &self.out.all_text, &stats);
        let finish_name = match finish {
            Finish::Stop | Finish::StopSequence(_) => "stop",
            Finish::Length => "length",
            Finish::ToolCalls => "tool_calls",
        };
        crate::request_log::done(rep.quiet, seq, kind, prep, prefill_time, &stats, finish_name);
        let usage = Usage { prompt_tokens: prep.prompt.len(), cached_tokens: prep.cached, completion_tokens: stats.gen_tokens, reasoning_tokens: self.reasoning_tokens.min(stats.gen_tokens) };
        let _ = self.job.events.send(Event::Done { finish, usage });
    }
}
