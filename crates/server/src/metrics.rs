//! Counters and gauges, rendered as Prometheus text on `GET /metrics`.
use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;

#[derive(Default)]
pub struct Metrics {
    /// (endpoint, status) → count.
    requests: Mutex<BTreeMap<(String, u16), u64>>,
    pub prompt_tokens: AtomicU64,
    pub cached_tokens: AtomicU64,
    pub prefilled_tokens: AtomicU64,
    pub generated_tokens: AtomicU64,
    pub prefill_micros: AtomicU64,
    pub decode_micros: AtomicU64,
    /// Last request's rates, in milli-tokens per second.
    pub last_prefill_mtps: AtomicU64,
    pub last_decode_mtps: AtomicU64,
    /// MTP speculative decoding: drafted and accepted tokens, in total and of the last request.
    pub mtp_drafted: AtomicU64,
    pub mtp_accepted: AtomicU64,
    pub last_mtp_drafted: AtomicU64,
    pub last_mtp_accepted: AtomicU64,
    pub queue_depth: AtomicU64,
    pub busy: AtomicU64,
    pub jobs_completed: AtomicU64,
    pub jobs_cancelled: AtomicU64,
    pub jobs_failed: AtomicU64,
    pub queue_rejected: AtomicU64,
    pub kv_hits: AtomicU64,
    pub kv_misses: AtomicU64,
    pub kv_extend: AtomicU64,
    pub kv_exact: AtomicU64,
    pub kv_text_prefix: AtomicU64,
    pub kv_snapshot: AtomicU64,
    pub kv_snapshots_held: AtomicU64,
    pub kv_snapshot_bytes: AtomicU64,
    pub tool_replay_exact: AtomicU64,
    pub kv_disk: AtomicU64,
    pub kv_disk_hits: AtomicU64,
    pub kv_disk_misses: AtomicU64,
    pub kv_disk_saves: AtomicU64,
    pub kv_disk_evictions: AtomicU64,
    pub kv_disk_removed_bad: AtomicU64,
    pub kv_disk_loaded_tokens: AtomicU64,
    pub kv_disk_written_bytes: AtomicU64,
    pub kv_disk_read_bytes: AtomicU64,
    pub kv_disk_bytes: AtomicU64,
    pub kv_disk_files: AtomicU64,
    pub tool_calls: AtomicU64,
    /// KV sessions of the batched scheduler (`--batched-session`), and how many run a request now.
    pub batch_slots: AtomicU64,
    pub active_sessions: AtomicU64,
    /// Sequences in the last batched decode step; steps and rows so far.
    pub batch_last_size: AtomicU64,
    pub batch_steps: AtomicU64,
    pub batch_rows: AtomicU64,
    /// Time from queueing a request to its first generated token.
    pub ttft_micros: AtomicU64,
    pub ttft_count: AtomicU64,
    pub last_ttft_micros: AtomicU64,
    /// The open connections (set by the accept loop).
    pub connections: std::sync::OnceLock<std::sync::Arc<crate::conn_limit::Registry>>,
}

impl Metrics {
    pub fn request(&self, endpoint: &str, status: u16) {
        if let Ok(mut m) = self.requests.lock() {
            *m.entry((endpoint.to_string(), status)).or_default() += 1;
        }
    }

    pub fn render(&self) -> String {
        let mut s = String::new();
        let c = |s: &mut String, name: &str, help: &str, v: u64| {
            let _ = writeln!(s, "# HELP {name} {help}\n# TYPE {name} counter\n{name} {v}");
        };
        let g = |s: &mut String, name: &str, help: &str, v: f64| {
            let _ = writeln!(s, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {v}");
        };
        let _ = writeln!(s, "# HELP ds4_requests_total HTTP requests by endpoint and status.\n# TYPE ds4_requests_total counter");
        if let Ok(m) = self.requests.lock() {
            for ((ep, st), n) in m.iter() {
                let _ = writeln!(s, "ds4_requests_total{{endpoint=\"{ep}\",status=\"{st}\"}} {n}");
            }
        }
        c(&mut s, "ds4_prompt_tokens_total", "Prompt tokens of generation requests.", self.prompt_tokens.load(Relaxed));
        c(&mut s, "ds4_cached_tokens_total", "Prompt tokens served from the live KV state (not prefilled).", self.cached_tokens.load(Relaxed));
        c(&mut s, "ds4_prefilled_tokens_total", "Prompt tokens actually prefilled.", self.prefilled_tokens.load(Relaxed));
        c(&mut s, "ds4_generated_tokens_total", "Tokens sampled.", self.generated_tokens.load(Relaxed));
        c(&mut s, "ds4_prefill_microseconds_total", "Time spent in prefill.", self.prefill_micros.load(Relaxed));
        c(&mut s, "ds4_decode_microseconds_total", "Time spent decoding.", self.decode_micros.load(Relaxed));
        g(&mut s, "ds4_prefill_tokens_per_second", "Prefill rate of the last request.", self.last_prefill_mtps.load(Relaxed) as f64 / 1000.0);
        g(&mut s, "ds4_decode_tokens_per_second", "Decode rate of the last request.", self.last_decode_mtps.load(Relaxed) as f64 / 1000.0);
        c(&mut s, "ds4_mtp_drafted_tokens_total", "MTP draft tokens verified by the model.", self.mtp_drafted.load(Relaxed));
        c(&mut s, "ds4_mtp_accepted_tokens_total", "MTP draft tokens accepted.", self.mtp_accepted.load(Relaxed));
        let (d, a) = (self.last_mtp_drafted.load(Relaxed), self.last_mtp_accepted.load(Relaxed));
        g(&mut s, "ds4_mtp_last_drafted_tokens", "MTP draft tokens of the last request.", d as f64);
        g(&mut s, "ds4_mtp_last_accepted_tokens", "Accepted MTP draft tokens of the last request.", a as f64);
        g(&mut s, "ds4_mtp_last_acceptance_rate", "Accepted over drafted tokens of the last request (0 when none drafted).", if d > 0 { a as f64 / d as f64 } else { 0.0 });
        g(&mut s, "ds4_queue_depth", "Jobs waiting for the inference worker.", self.queue_depth.load(Relaxed) as f64);
        g(&mut s, "ds4_worker_busy", "1 while the worker runs a job.", self.busy.load(Relaxed) as f64);
        c(&mut s, "ds4_jobs_completed_total", "Generation jobs that finished.", self.jobs_completed.load(Relaxed));
        c(&mut s, "ds4_jobs_cancelled_total", "Generation jobs stopped because the client went away.", self.jobs_cancelled.load(Relaxed));
        c(&mut s, "ds4_jobs_failed_total", "Generation jobs that failed with an error.", self.jobs_failed.load(Relaxed));
        c(&mut s, "ds4_queue_rejected_total", "Requests refused because the queue was full.", self.queue_rejected.load(Relaxed));
        c(&mut s, "ds4_kv_reuse_hits_total", "Requests that reused live or snapshot KV state.", self.kv_hits.load(Relaxed));
        c(&mut s, "ds4_kv_reuse_misses_total", "Requests prefilled from scratch.", self.kv_misses.load(Relaxed));
        let _ = writeln!(s, "# HELP ds4_kv_reuse_total KV reuse hits by kind.\n# TYPE ds4_kv_reuse_total counter");
        for (k, v) in [("extend", &self.kv_extend), ("exact", &self.kv_exact), ("text_prefix", &self.kv_text_prefix), ("snapshot", &self.kv_snapshot), ("disk", &self.kv_disk)] {
            let _ = writeln!(s, "ds4_kv_reuse_total{{kind=\"{k}\"}} {}", v.load(Relaxed));
        }
        g(&mut s, "ds4_kv_snapshots", "KV snapshots held for rewinds.", self.kv_snapshots_held.load(Relaxed) as f64);
        g(&mut s, "ds4_kv_snapshot_bytes", "Bytes held by KV snapshots.", self.kv_snapshot_bytes.load(Relaxed) as f64);
        c(&mut s, "ds4_kv_disk_hits_total", "Requests restored from the disk KV cache.", self.kv_disk_hits.load(Relaxed));
        c(&mut s, "ds4_kv_disk_misses_total", "Disk KV cache lookups that found no longer prefix than memory.", self.kv_disk_misses.load(Relaxed));
        c(&mut s, "ds4_kv_disk_saves_total", "Sessions written to the disk KV cache.", self.kv_disk_saves.load(Relaxed));
        c(&mut s, "ds4_kv_disk_evictions_total", "Disk KV cache files evicted for space.", self.kv_disk_evictions.load(Relaxed));
        c(&mut s, "ds4_kv_disk_bad_files_total", "Disk KV cache files of this model found truncated or corrupted, and removed (other models' files are left in place).", self.kv_disk_removed_bad.load(Relaxed));
        c(&mut s, "ds4_kv_disk_loaded_tokens_total", "Prompt tokens restored from disk instead of prefilled.", self.kv_disk_loaded_tokens.load(Relaxed));
        c(&mut s, "ds4_kv_disk_written_bytes_total", "Bytes written to the disk KV cache.", self.kv_disk_written_bytes.load(Relaxed));
        c(&mut s, "ds4_kv_disk_read_bytes_total", "Bytes read from the disk KV cache.", self.kv_disk_read_bytes.load(Relaxed));
        g(&mut s, "ds4_kv_disk_bytes", "Bytes held by disk KV cache files.", self.kv_disk_bytes.load(Relaxed) as f64);
        g(&mut s, "ds4_kv_disk_files", "Disk KV cache files.", self.kv_disk_files.load(Relaxed) as f64);
        // Weight residency operations per phase: after load, prefill and decode must stay at zero.
        let r = ds4_model::residency::snapshot();
        let _ = writeln!(s, "# HELP ds4_weight_residency_ops_total Weight map/bind/upload operations by phase.\n# TYPE ds4_weight_residency_ops_total counter");
        for (pn, p) in [("load", ds4_model::residency::Phase::Load), ("prefill", ds4_model::residency::Phase::Prefill), ("decode", ds4_model::residency::Phase::Decode)] {
            for (on, o) in [("map", ds4_model::residency::Op::Map), ("bind", ds4_model::residency::Op::Bind), ("upload", ds4_model::residency::Op::Upload)] {
                let _ = writeln!(s, "ds4_weight_residency_ops_total{{phase=\"{pn}\",op=\"{on}\"}} {}", r.get(p, o));
            }
        }
        g(&mut s, "ds4_batch_sessions", "KV sessions of the batched scheduler (--batched-session).", self.batch_slots.load(Relaxed) as f64);
        g(&mut s, "ds4_active_sessions", "Sessions running a request (prefilling or decoding).", self.active_sessions.load(Relaxed) as f64);
        g(&mut s, "ds4_batch_size", "Sequences in the last batched decode step.", self.batch_last_size.load(Relaxed) as f64);
        c(&mut s, "ds4_batch_steps_total", "Batched decode steps.", self.batch_steps.load(Relaxed));
        c(&mut s, "ds4_batch_rows_total", "Sequence-steps decoded by batched steps (rows / steps = mean batch size).", self.batch_rows.load(Relaxed));
        c(&mut s, "ds4_time_to_first_token_microseconds_total", "Sum over requests of the time from queueing to the first generated token.", self.ttft_micros.load(Relaxed));
        c(&mut s, "ds4_time_to_first_token_count", "Requests that generated a first token.", self.ttft_count.load(Relaxed));
        g(&mut s, "ds4_time_to_first_token_seconds", "Time to first token of the last request.", self.last_ttft_micros.load(Relaxed) as f64 / 1e6);
        c(&mut s, "ds4_tool_calls_total", "Tool calls generated.", self.tool_calls.load(Relaxed));
        c(&mut s, "ds4_tool_replay_exact_total", "History tool-call blocks replayed byte-exact from the id map.", self.tool_replay_exact.load(Relaxed));
        if let Some(r) = self.connections.get() {
            g(&mut s, "ds4_http_connections_open", "Open HTTP connections.", r.open() as f64);
            c(&mut s, "ds4_http_connections_evicted_total", "Idle connections closed to make room for new ones (--max-connections).", r.evictions.load(Relaxed));
            c(&mut s, "ds4_http_connections_refused_total", "Connections refused with 503 because every open one had a request in flight.", r.refused.load(Relaxed));
        }
        g(&mut s, "ds4_process_resident_bytes", "Resident set size of the server process.", resident_bytes() as f64);
        s
    }
}

/// Resident set size from /proc/self/statm (0 where unavailable).
pub fn resident_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1).and_then(|p| p.parse::<u64>().ok()))
        .map(|pages| pages * 4096)
        .unwrap_or(0)
}
