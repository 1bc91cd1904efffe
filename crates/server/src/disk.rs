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

pub struct DiskCache {
    store: KvStore,
    pub min_tokens: usize,
    metrics: Arc<Metrics>,
    tool_mem: Arc<Mutex<ToolMemory>>,
    loaded_tokens: u64,
}

impl DiskCache {
    pub fn new(store: KvStore, min_tokens: usize, metrics: Arc<Metrics>, tool_mem: Arc<Mutex<ToolMemory>>) -> Self {
        let d = Self { store, min_tokens, metrics, tool_mem, loaded_tokens: 0 };
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
        if session.tokens.len() < self.min_tokens || session.logits.is_empty() || session.kv.pos != session.tokens.len() {
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
