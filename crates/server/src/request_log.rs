//! The per-request log on stderr (silenced by `--quiet`): one line when a request ends, and progress
//! lines while a long prompt is prefilled.
use crate::kv_reuse::Prepared;
use ds4_engine::GenStats;
use std::time::{Duration, Instant};

/// Prompts with fewer tokens to prefill than this get no progress lines.
const PROGRESS_MIN_TOKENS: usize = 2048;
/// At most one progress line per this interval.
const PROGRESS_EVERY: Duration = Duration::from_secs(5);

fn endpoint(kind: &str) -> &'static str {
    match kind {
        "chat" => "/v1/chat/completions",
        "completion" => "/v1/completions",
        "responses" => "/v1/responses",
        "messages" => "/v1/messages",
        _ => "other",
    }
}

fn rate(n: usize, t: Duration) -> f64 {
    let s = t.as_secs_f64();
    if n == 0 || s <= 0.0 { 0.0 } else { n as f64 / s }
}

/// The line for a finished request (`finish`: stop, length, tool_calls, cancelled, error).
pub fn line(seq: u64, kind: &str, prep: &Prepared, prefill: Duration, stats: &GenStats, finish: &str) -> String {
    // MTP: drafted and accepted tokens when the request drafted any.
    let mtp = if stats.drafted > 0 { format!(" mtp={}/{}", stats.accepted, stats.drafted) } else { String::new() };
    format!(
        "ds4-server: req {seq} {} prompt={} cached={} gen={} prefill={:.1} t/s decode={:.1} t/s time={:.2}s finish={finish}{mtp}",
        endpoint(kind),
        prep.prompt.len(),
        prep.cached,
        stats.gen_tokens,
        rate(prep.prefilled, prefill),
        rate(stats.gen_tokens, stats.gen_time),
        (prefill + stats.gen_time).as_secs_f64(),
    )
}

pub fn done(quiet: bool, seq: u64, kind: &str, prep: &Prepared, prefill: Duration, stats: &GenStats, finish: &str) {
    if !quiet {
        eprintln!("{}", line(seq, kind, prep, prefill, stats, finish));
    }
}

/// Progress of one prefill: a line every few seconds for long prompts.
pub struct PrefillProgress {
    seq: u64,
    kind: &'static str,
    quiet: bool,
    every: Duration,
    t0: Instant,
    last: Instant,
}

impl PrefillProgress {
    pub fn new(seq: u64, kind: &'static str, quiet: bool) -> Self {
        let now = Instant::now();
        Self { seq, kind, quiet, every: PROGRESS_EVERY, t0: now, last: now }
    }

    /// `done` of `total` tokens prefilled so far: prints the progress line when one is due.
    pub fn update(&mut self, done: usize, total: usize) {
        if let Some(l) = self.due(done, total) {
            eprintln!("{l}");
        }
    }

    fn due(&mut self, done: usize, total: usize) -> Option<String> {
        if self.quiet || total < PROGRESS_MIN_TOKENS || done == 0 {
            return None;
        }
        let now = Instant::now();
        if now.duration_since(self.last) < self.every && done < total {
            return None;
        }
        self.last = now;
        let el = now.duration_since(self.t0);
        Some(format!(
            "ds4-server: req {} {} prefill {done}/{total} ({:.0}%) {:.1} t/s {:.1}s",
            self.seq,
            endpoint(self.kind),
            done as f64 * 100.0 / total as f64,
            rate(done, el),
            el.as_secs_f64()
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv_reuse::Decision;

    #[test]
    fn the_request_line_names_every_figure() {
        let prep = Prepared { prompt: vec![0; 300], cached: 100, prefilled: 200, decision: Decision::Extend, live_common: 100, live_len: 100 };
        let stats = GenStats { gen_tokens: 50, gen_time: Duration::from_secs(2), ..GenStats::default() };
        let l = line(7, "chat", &prep, Duration::from_secs(4), &stats, "stop");
        assert_eq!(l, "ds4-server: req 7 /v1/chat/completions prompt=300 cached=100 gen=50 prefill=50.0 t/s decode=25.0 t/s time=6.00s finish=stop");
    }

    #[test]
    fn progress_only_for_long_prompts_and_not_when_quiet() {
        let mut p = PrefillProgress::new(3, "messages", false);
        p.every = Duration::ZERO;
        assert!(p.due(100, 1000).is_none(), "short prompt");
        let l = p.due(1024, 4096).unwrap();
        assert!(l.starts_with("ds4-server: req 3 /v1/messages prefill 1024/4096 (25%) "), "{l}");
        let mut p = PrefillProgress::new(3, "messages", false);
        assert!(p.due(1024, 4096).is_none(), "within the interval");
        assert!(p.due(4096, 4096).is_some(), "the end is always reported");
        let mut q = PrefillProgress::new(3, "messages", true);
        q.every = Duration::ZERO;
        assert!(q.due(1024, 4096).is_none());
    }
}
