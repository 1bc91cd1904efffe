//! The server's side of the disk KV cache (spec §5.8, `--kv-disk-dir`): saves the live session (after a
//! long prefill, before an unrelated conversation replaces it, at shutdown), restores the longest cached
//! prefix of a prompt, carries the tool-id → DSML entries whose blocks occur in the saved text, and
//! mirrors the store's counters into `/metrics`.
use crate::metrics::Metrics;
use crate::tools::ToolMemory;
use ds4_engine::{Engine, Session};
use ds4_kvstore::{Entry, KvStore, Reason, SaveOutcome, StateRef};
use ds4_tokenizer::Tokenizer;
use std::collections::HashSet;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex};

const CALLS_OPEN: &str = "<｜DSML｜tool_calls>";
const CALLS_CLOSE: &str = "</｜DSML｜tool_calls>";

/// When the live session is saved while prefilling (ds4's `--kv-cache-*` flags).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SavePolicy {
    /// Shorter sessions are neither saved nor loaded.
    pub min_tokens: usize,
    /// Cold prompts of [min, cold_max] tokens are saved before generation; 0 = never.
    pub cold_max: usize,
    /// Saves at every multiple of this many tokens crossed while prefilling; 0 = never.
    pub interval: usize,
    /// Cold saves drop this many tokens from the end, then align down to a multiple of `align` (0 = no
    /// alignment): the end of a prompt is what the next request most often changes.
    pub trim: usize,
    pub align: usize,
}

impl SavePolicy {
    pub fn from_args(a: &crate::args::Args) -> Self {
        Self {
            min_tokens: a.kv_disk_min_tokens,
            cold_max: a.kv_cache_cold_max_tokens,
            interval: a.kv_cache_continued_interval_tokens,
            trim: a.kv_cache_boundary_trim_tokens,
            align: a.kv_cache_boundary_align_tokens,
        }
    }

    /// Where a cold prompt of `len` tokens is saved, if at all.
    pub fn cold_point(&self, len: usize) -> Option<usize> {
        if self.cold_max == 0 || len < self.min_tokens || len > self.cold_max {
            return None;
        }
        let p = len.saturating_sub(self.trim);
        let p = p.checked_div(self.align).map_or(p, |q| q * self.align);
        (p >= self.min_tokens && p > 0).then_some(p)
    }

    /// The interval frontiers in (from, to].
    pub fn continued_points(&self, from: usize, to: usize) -> Vec<usize> {
        if self.interval == 0 {
            return Vec::new();
        }
        let first = (from / self.interval + 1) * self.interval;
        (first..=to).step_by(self.interval).filter(|&p| p >= self.min_tokens).collect()
    }
}

impl std::fmt::Display for SavePolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "min={} cold_max={} continued={} trim={} align={}", self.min_tokens, self.cold_max, self.interval, self.trim, self.align)
    }
}

/// Checks before loading that `dir` exists or can be created, is a directory, and is writable.
pub fn check_dir(dir: &std::path::Path) -> Result<(), String> {
    if dir.exists() && !dir.is_dir() {
        return Err("not a directory".into());
    }
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot create it: {e}"))?;
    let probe = dir.join(format!(".ds4-write-check.tmp{}", std::process::id()));
    std::fs::write(&probe, b"ok").map_err(|e| format!("not writable: {e}"))?;
    let _ = std::fs::remove_file(&probe);
    Ok(())
}

pub struct DiskCache {
    store: KvStore,
    pub policy: SavePolicy,
    metrics: Arc<Metrics>,
    tool_mem: Arc<Mutex<ToolMemory>>,
    loaded_tokens: u64,
}

impl DiskCache {
    pub fn new(store: KvStore, policy: SavePolicy, metrics: Arc<Metrics>, tool_mem: Arc<Mutex<ToolMemory>>) -> Self {
        let d = Self { store, policy, metrics, tool_mem, loaded_tokens: 0 };
        // Requests render their history (exact tool-call replay) before any KV is loaded: the saved
        // tool-id → DSML entries are needed from the start.
        let mut n = 0;
        if let Ok(mut mem) = d.tool_mem.lock() {
            for e in d.store.entries() {
                for (id, dsml) in e.tool_map.iter() {
                    if mem.get(id).is_none() {
                        mem.insert(std::slice::from_ref(id), dsml);
                        n += 1;
                    }
                }
            }
        }
        if n > 0 {
            eprintln!("ds4-server: kv disk cache: {n} tool-call ids restored");
        }
        d.publish();
        d
    }

    fn publish(&self) {
        let s = self.store.stats;
        let m = &self.metrics;
        m.kv_disk_hits.store(s.hits, Relaxed);
        m.kv_disk_misses.store(s.misses, Relaxed);
        m.kv_disk_saves.store(s.saves, Relaxed);
        m.kv_disk_evictions.store(s.evictions, Relaxed);
        m.kv_disk_removed_bad.store(s.removed_bad, Relaxed);
        m.kv_disk_written_bytes.store(s.bytes_written, Relaxed);
        m.kv_disk_read_bytes.store(s.bytes_read, Relaxed);
        m.kv_disk_loaded_tokens.store(self.loaded_tokens, Relaxed);
        m.kv_disk_bytes.store(self.store.total_bytes(), Relaxed);
        m.kv_disk_files.store(self.store.len() as u64, Relaxed);
    }

    /// Tool-map entries whose DSML block occurs in `text` (only those can be needed to replay it). The
    /// last block may be cut short: generation stops on its closing marker before feeding it back.
    fn tool_entries(&self, text: &str) -> Vec<(String, String)> {
        let mut blocks: HashSet<&str> = HashSet::new();
        let mut tail: Option<&str> = None;
        let mut at = 0;
        while let Some(i) = text[at..].find(CALLS_OPEN) {
            let start = at + i;
            match text[start..].find(CALLS_CLOSE) {
                Some(j) => {
                    let end = start + j + CALLS_CLOSE.len();
                    blocks.insert(&text[start..end]);
                    at = end;
                }
                None => {
                    tail = Some(&text[start..]);
                    break;
                }
            }
        }
        if blocks.is_empty() && tail.is_none() {
            return Vec::new();
        }
        let Ok(mem) = self.tool_mem.lock() else { return Vec::new() };
        mem.entries()
            .into_iter()
            .filter(|(_, raw)| {
                let r = raw.trim_start();
                blocks.contains(r) || tail.is_some_and(|t| r.starts_with(t))
            })
            .map(|(id, raw)| (id, raw.to_string()))
            .collect()
    }

    /// Saves the session when it is long enough and not on disk already (on a GPU backend its KV
    /// state is downloaded from the device first).
    pub fn save(&mut self, session: &mut Session, engine: &mut Engine, tok: &Tokenizer, reason: Reason) {
        if session.tokens.len() < self.policy.min_tokens || session.logits.is_empty() || session.kv.pos != session.tokens.len() {
            return;
        }
        if !self.store.contains(&session.tokens) {
            if let Err(e) = engine.kv_to_host(&mut session.kv) {
                eprintln!("ds4-server: kv disk cache save failed: {e}");
                return;
            }
        }
        if self.store.contains(&session.tokens) {
            // Refreshes its last use.
            let _ = self.store.save(&StateRef { tokens: &session.tokens, kv: &session.kv, logits: &session.logits, tool_map: &[] }, reason);
            self.publish();
            return;
        }
        let map = self.tool_entries(&tok.decode(&session.tokens));
        let st = StateRef { tokens: &session.tokens, kv: &session.kv, logits: &session.logits, tool_map: &map };
        match self.store.save(&st, reason) {
            Ok(SaveOutcome::Stored { .. } | SaveOutcome::AlreadyStored | SaveOutcome::TooLarge { .. }) => {}
            Err(e) => eprintln!("ds4-server: kv disk cache save failed: {e}"),
        }
        self.publish();
    }

    /// The longest cached prefix of `prompt` with more than `longer_than` tokens.
    pub fn find(&mut self, prompt: &[u32], longer_than: usize) -> Option<Entry> {
        let e = self.store.lookup_longest_prefix(prompt, longer_than);
        self.publish();
        e
    }

    /// Replaces the session with `entry`'s state. False (session reset, file removed if bad) on failure.
    pub fn restore(&mut self, entry: &Entry, session: &mut Session, engine: &mut Engine) -> bool {
        session.reset(engine);
        let vocab = (!session.kv.layers.is_empty()).then(|| engine.cfg().n_vocab);
        let t0 = std::time::Instant::now();
        let r = self.store.load(entry, &mut session.kv, &mut session.logits, vocab);
        let ok = match r {
            // On a GPU backend the restored state becomes the device's.
            Ok(r) if !session.logits.is_empty() && engine.kv_to_device(&session.kv).is_ok() => {
                session.tokens = r.tokens;
                self.loaded_tokens += session.tokens.len() as u64;
                eprintln!(
                    "ds4-server: kv disk cache hit tokens={} load={:.1}ms",
                    session.tokens.len(),
                    t0.elapsed().as_secs_f64() * 1000.0
                );
                if let Ok(mut mem) = self.tool_mem.lock() {
                    for (id, dsml) in &r.tool_map {
                        if mem.get(id).is_none() {
                            mem.insert(std::slice::from_ref(id), dsml);
                        }
                    }
                }
                true
            }
            Ok(_) => false,
            Err(_) => false,
        };
        if !ok {
            session.reset(engine);
        }
        self.publish();
        ok
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ds4_defaults() -> SavePolicy {
        SavePolicy { min_tokens: 512, cold_max: 30000, interval: 10000, trim: 32, align: 2048 }
    }

    #[test]
    fn cold_saves_are_trimmed_and_aligned() {
        let p = ds4_defaults();
        assert_eq!(p.cold_point(5000), Some(4096));
        assert_eq!(p.cold_point(2080), Some(2048));
        assert_eq!(p.cold_point(2079), None); // 2047 aligns down to 0
        assert_eq!(p.cold_point(30001), None);
        assert_eq!(SavePolicy { cold_max: 0, ..p }.cold_point(5000), None);
        assert_eq!(SavePolicy { trim: 0, align: 0, min_tokens: 8, ..p }.cold_point(100), Some(100));
    }

    #[test]
    fn continued_saves_at_interval_frontiers() {
        let p = ds4_defaults();
        assert_eq!(p.continued_points(0, 25000), vec![10000, 20000]);
        assert_eq!(p.continued_points(10000, 20000), vec![20000]);
        assert!(p.continued_points(10001, 19999).is_empty());
        assert!(SavePolicy { interval: 0, ..p }.continued_points(0, 50000).is_empty());
    }

    #[test]
    fn unusable_directories_are_refused() {
        let base = std::env::temp_dir().join(format!("ds4-disk-check-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        assert!(check_dir(&base.join("new/sub")).is_ok());
        let file = base.join("file");
        std::fs::write(&file, b"x").unwrap();
        assert!(check_dir(&file).unwrap_err().contains("not a directory"));
        assert!(check_dir(&file.join("below")).is_err());
        let _ = std::fs::remove_dir_all(&base);
    }
}
