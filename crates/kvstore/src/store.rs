//! A directory of cache files under a space budget.
//!
//! Files are named `<sha256 of the token ids>.kv`. At start-up the front of every file (header and token
//! ids, which carry their own checksum) is read to rebuild the index of token prefixes; bad files are
//! logged and removed. Hit counts and last-use times live in a small sidecar file (`hits.idx`, advisory:
//! a damaged one only loses eviction hints). Eviction picks the file with the lowest
//! `(hits·2^(−age/half-life) + 1) · tokens / bytes`, ties going to the least recently used.
//!
//! Readers and eviction: a load opens the file and reads it through that descriptor, so a concurrent
//! unlink (another process sharing the directory) cannot take the data away (Unix semantics); within a
//! process the store is `&mut`, so nothing is evicted while it loads.
use crate::format::{self, hex, token_key, FormatError, Reason, Restored, StateRef};
use ds4_model::KvState;
use std::collections::HashMap;
use std::io::BufReader;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

const INDEX: &str = "hits.idx";
const EXT: &str = "kv";

#[derive(Debug, Clone)]
pub struct Entry {
    pub key: [u8; 32],
    pub tokens: Arc<Vec<u32>>,
    /// Tool-call id → DSML entries saved with the file (read with the index, before any load).
    pub tool_map: Arc<Vec<(String, String)>>,
    pub size: u64,
    pub hits: u64,
    pub last_used_ms: u64,
    seq: u64,
}

/// Counters since the store was opened.
#[derive(Debug, Clone, Copy, Default)]
pub struct Stats {
    pub hits: u64,
    pub misses: u64,
    pub saves: u64,
    pub evictions: u64,
    /// This store's files found bad (truncated, corrupted, another format version) and removed.
    pub removed_bad: u64,
    /// Cache files of other models (or numerics options) sharing the directory, found at open and
    /// left in place: neither indexed nor counted in this store's budget.
    pub foreign: u64,
    pub bytes_written: u64,
    pub bytes_read: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SaveOutcome {
    Stored { bytes: u64, evicted: usize },
    /// A file for exactly these tokens exists already (its last-use time was refreshed).
    AlreadyStored,
    /// The file would exceed the whole budget on its own: not written.
    TooLarge { bytes: u64 },
}

pub struct KvStore {
    dir: PathBuf,
    budget: u64,
    model: [u8; 32],
    entries: HashMap<[u8; 32], Entry>,
    seq: u64,
    half_life: Duration,
    pub stats: Stats,
}

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

fn warn(msg: impl std::fmt::Display) {
    eprintln!("kv disk cache: WARNING {msg}");
}

fn parse_key(name: &str) -> Option<[u8; 32]> {
    let stem = name.strip_suffix(&format!(".{EXT}"))?;
    if stem.len() != 64 {
        return None;
    }
    let mut k = [0u8; 32];
    for (i, b) in k.iter_mut().enumerate() {
        *b = u8::from_str_radix(stem.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(k)
}

impl KvStore {
    /// Opens (creating) `dir`, indexes its files for `model`, removes bad ones, and trims to `budget`.
    pub fn open(dir: &Path, budget: u64, model: [u8; 32]) -> std::io::Result<Self> {
        std::fs::create_dir_all(dir)?;
        let mut s = Self { dir: dir.to_path_buf(), budget, model, entries: HashMap::new(), seq: 0, half_life: Duration::from_secs(6 * 3600), stats: Stats::default() };
        let hints = s.read_hints();
        let mut names: Vec<(String, PathBuf)> = Vec::new();
        for e in std::fs::read_dir(dir)? {
            let Ok(e) = e else { continue };
            let Ok(name) = e.file_name().into_string() else { continue };
            names.push((name, e.path()));
        }
        names.sort();
        for (name, path) in names {
            if name.starts_with('.') && name.contains(".tmp") {
                // Left by an interrupted write. A live writer in another process finishes within seconds.
                let old = std::fs::metadata(&path).and_then(|m| m.modified()).map(|t| t.elapsed().unwrap_or_default() > Duration::from_secs(60)).unwrap_or(true);
                if old || name.ends_with(&format!(".tmp{}", std::process::id())) {
                    let _ = std::fs::remove_file(&path);
                }
                continue;
            }
            // Only `<sha256>.kv` names are this cache's; any other file (a `--kv-save` session file,
            // the user's own) is left alone.
            if parse_key(&name).is_none() {
                continue;
            }
            match s.index_file(&name, &path) {
                Ok(mut e) => {
                    if let Some(&(hits, last)) = hints.get(&e.key) {
                        e.hits = hits;
                        e.last_used_ms = last;
                    }
                    s.seq += 1;
                    e.seq = s.seq;
                    s.entries.insert(e.key, e);
                }
                // Another model's cache in a shared directory (e.g. the q2 and q4 files): kept for it.
                Err(FormatError::OtherModel) => s.stats.foreign += 1,
                Err(err) => s.remove_bad(&path, &err),
            }
        }
        // Oldest first in the tie-break order.
        let mut order: Vec<([u8; 32], u64)> = s.entries.values().map(|e| (e.key, e.last_used_ms)).collect();
        order.sort_by_key(|&(k, t)| (t, k));
        for (i, (k, _)) in order.into_iter().enumerate() {
            if let Some(e) = s.entries.get_mut(&k) {
                e.seq = i as u64 + 1;
            }
        }
        s.seq = s.entries.len() as u64;
        let evicted = s.make_room(0, None);
        if evicted > 0 {
            s.write_hints();
        }
        eprintln!(
            "kv disk cache: {} ({} files, {} bytes, budget {} bytes)",
            dir.display(),
            s.entries.len(),
            s.total_bytes(),
            budget
        );
        Ok(s)
    }

    fn index_file(&self, name: &str, path: &Path) -> Result<Entry, FormatError> {
        let key = parse_key(name).ok_or_else(|| FormatError::Shape("file name is not <sha256>.kv".into()))?;
        let f = std::fs::File::open(path)?;
        let len = f.metadata()?.len();
        let modified = f.metadata()?.modified().ok().and_then(|t| t.duration_since(UNIX_EPOCH).ok()).map(|d| d.as_millis() as u64).unwrap_or(0);
        let front = format::read_front(&mut BufReader::new(f), len, &self.model)?;
        if front.file_len() != len {
            return Err(FormatError::Truncated(format!("file has {len} bytes, header describes {}", front.file_len())));
        }
        if token_key(&front.tokens) != key {
            return Err(FormatError::Shape("file name does not match its token ids".into()));
        }
        Ok(Entry { key, tokens: Arc::new(front.tokens), tool_map: Arc::new(front.tool_map), size: len, hits: 0, last_used_ms: modified, seq: 0 })
    }

    fn path_of(&self, key: &[u8; 32]) -> PathBuf {
        self.dir.join(format!("{}.{EXT}", hex(key)))
    }

    fn remove_bad(&mut self, path: &Path, err: &FormatError) {
        warn(format_args!("ignoring and removing cache file {}: {err}", path.display()));
        self.stats.removed_bad += 1;
        if let Err(e) = std::fs::remove_file(path) {
            if e.kind() != std::io::ErrorKind::NotFound {
                warn(format_args!("cannot remove {}: {e}", path.display()));
            }
        }
    }

    fn read_hints(&self) -> HashMap<[u8; 32], (u64, u64)> {
        let mut m = HashMap::new();
        let Ok(text) = std::fs::read_to_string(self.dir.join(INDEX)) else { return m };
        for line in text.lines().take(1 << 20) {
            let mut it = line.split_ascii_whitespace();
            let (Some(k), Some(h), Some(t)) = (it.next(), it.next(), it.next()) else { continue };
            let (Some(k), Ok(h), Ok(t)) = (parse_key(&format!("{k}.{EXT}")), h.parse::<u64>(), t.parse::<u64>()) else { continue };
            m.insert(k, (h, t));
        }
        m
    }

    fn write_hints(&self) {
        let mut s = String::new();
        for e in self.entries.values() {
            s.push_str(&format!("{} {} {}\n", hex(&e.key), e.hits, e.last_used_ms));
        }
        if let Err(e) = format::write_atomic(&self.dir.join(INDEX), s.as_bytes()) {
            warn(format_args!("cannot write {}: {e}", self.dir.join(INDEX).display()));
        }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }
    pub fn budget(&self) -> u64 {
        self.budget
    }
    pub fn len(&self) -> usize {
        self.entries.len()
    }
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
    /// Bytes of the indexed cache files.
    pub fn total_bytes(&self) -> u64 {
        self.entries.values().map(|e| e.size).sum()
    }
    pub fn contains(&self, tokens: &[u32]) -> bool {
        self.entries.contains_key(&token_key(tokens))
    }
    pub fn entries(&self) -> impl Iterator<Item = &Entry> {
        self.entries.values()
    }

    /// The entry with the most tokens that prefix `prompt` and number more than `longer_than`.
    /// Counts a miss when there is none.
    pub fn lookup_longest_prefix(&mut self, prompt: &[u32], longer_than: usize) -> Option<Entry> {
        let best = self
            .entries
            .values()
            .filter(|e| e.tokens.len() > longer_than && e.tokens.len() <= prompt.len() && prompt.starts_with(&e.tokens))
            .max_by_key(|e| (e.tokens.len(), e.seq))
            .cloned();
        if best.is_none() {
            self.stats.misses += 1;
        }
        best
    }

    /// Reads `entry` into `kv` (whose layout the file must match) and `logits`. A bad file is logged and
    /// removed; on any error `kv`/`logits` may be partly overwritten and the caller must reset them.
    pub fn load(&mut self, entry: &Entry, kv: &mut KvState, logits: &mut Vec<f32>, vocab: Option<usize>) -> Result<Restored, FormatError> {
        let path = self.path_of(&entry.key);
        let res = (|| {
            // The descriptor stays open for the whole read: an unlink meanwhile cannot take the data away.
            let f = std::fs::File::open(&path)?;
            let len = f.metadata()?.len();
            let r = format::decode_from(&mut BufReader::with_capacity(1 << 20, f), len, &self.model, kv, logits, vocab)?;
            if r.tokens != *entry.tokens {
                return Err(FormatError::Shape("token ids differ from the index".into()));
            }
            Ok((r, len))
        })();
        match res {
            Ok((r, len)) => {
                self.stats.hits += 1;
                self.stats.bytes_read += len;
                self.seq += 1;
                if let Some(e) = self.entries.get_mut(&entry.key) {
                    e.hits += 1;
                    e.last_used_ms = now_ms();
                    e.seq = self.seq;
                }
                self.write_hints();
                Ok(r)
            }
            Err(err) => {
                self.entries.remove(&entry.key);
                match &err {
                    FormatError::Io(e) if e.kind() == std::io::ErrorKind::NotFound => {
                        warn(format_args!("cache file {} disappeared", path.display()));
                    }
                    _ => self.remove_bad(&path, &err),
                }
                self.write_hints();
                Err(err)
            }
        }
    }

    /// Evicts files until `need` more bytes fit the budget (never `protect`). Returns how many went.
    fn make_room(&mut self, need: u64, protect: Option<[u8; 32]>) -> usize {
        let now = now_ms();
        let hl = self.half_life.as_millis().max(1) as f64;
        let mut n = 0;
        while self.total_bytes() + need > self.budget {
            let victim = self
                .entries
                .values()
                .filter(|e| Some(e.key) != protect)
                .map(|e| {
                    let age = now.saturating_sub(e.last_used_ms) as f64;
                    let eff = e.hits as f64 * (-(age / hl)).exp2();
                    let score = (eff + 1.0) * (e.tokens.len().max(1) as f64) / (e.size.max(1) as f64);
                    (score, e.seq, e.key)
                })
                .min_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
            let Some((_, _, key)) = victim else { break };
            let path = self.path_of(&key);
            if let Some(e) = self.entries.remove(&key) {
                eprintln!("kv disk cache: evicted reason=disk-cache-full tokens={} size={} hits={} file={}", e.tokens.len(), e.size, e.hits, path.display());
            }
            if let Err(e) = std::fs::remove_file(&path) {
                if e.kind() != std::io::ErrorKind::NotFound {
                    warn(format_args!("cannot remove {}: {e}", path.display()));
                }
            }
            self.stats.evictions += 1;
            n += 1;
        }
        n
    }

    /// Saves a session state under the key of its token ids, evicting first so the directory stays within
    /// the budget.
    pub fn save(&mut self, st: &StateRef, reason: Reason) -> std::io::Result<SaveOutcome> {
        let key = token_key(st.tokens);
        self.seq += 1;
        if let Some(e) = self.entries.get_mut(&key) {
            e.last_used_ms = now_ms();
            e.seq = self.seq;
            self.write_hints();
            return Ok(SaveOutcome::AlreadyStored);
        }
        let bytes = format::encode(&self.model, reason, st);
        let size = bytes.len() as u64;
        if size > self.budget {
            eprintln!("kv disk cache: not storing tokens={} size={size}: larger than the whole budget {}", st.tokens.len(), self.budget);
            return Ok(SaveOutcome::TooLarge { bytes: size });
        }
        let evicted = self.make_room(size, None);
        let path = self.path_of(&key);
        let t0 = std::time::Instant::now();
        if let Err(e) = format::write_atomic(&path, &bytes) {
            warn(format_args!("cannot write {}: {e}", path.display()));
            self.write_hints();
            return Err(e);
        }
        eprintln!(
            "kv disk cache: stored tokens={} reason={} size={size} save={:.1}ms file={}",
            st.tokens.len(),
            reason.name(),
            t0.elapsed().as_secs_f64() * 1000.0,
            path.display()
        );
        self.stats.saves += 1;
        self.stats.bytes_written += size;
        self.entries.insert(key, Entry { key, tokens: Arc::new(st.tokens.to_vec()), tool_map: Arc::new(st.tool_map.to_vec()), size, hits: 0, last_used_ms: now_ms(), seq: self.seq });
        self.write_hints();
        Ok(SaveOutcome::Stored { bytes: size, evicted })
    }
}
