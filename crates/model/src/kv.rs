//! Per-layer attention state: raw sliding window, compressed rows, indexer rows, compressor frontiers.
use crate::config::Config;
use crate::weights::LayerRange;

/// Sliding state of one compressor: `rows` candidate rows of `width` channels (kv and score).
#[derive(Debug, Clone, PartialEq)]
pub struct CompressorState {
    pub ratio: usize,
    pub width: usize,
    pub kv: Vec<f32>,
    pub score: Vec<f32>,
}

/// Rows kept by a compressor: overlapping windows (ratio 4) keep the previous window's rows too.
pub fn compressor_rows(ratio: usize) -> usize {
    if ratio == 4 { 2 * ratio } else { ratio }
}

impl CompressorState {
    pub fn new(ratio: usize, coff: usize, d: usize) -> Self {
        let rows = compressor_rows(ratio);
        let width = coff * d;
        Self { ratio, width, kv: vec![0.0; rows * width], score: vec![f32::NEG_INFINITY; rows * width] }
    }
    pub fn bytes(&self) -> usize { (self.kv.len() + self.score.len()) * 4 }
}

/// Growing list of fixed-width rows with a capacity set up front.
#[derive(Debug, Clone, PartialEq)]
pub struct Rows {
    pub width: usize,
    pub n: usize,
    pub data: Vec<f32>,
}

impl Rows {
    pub fn with_capacity(width: usize, cap: usize) -> Self {
        Self { width, n: 0, data: Vec::with_capacity(width * cap) }
    }
    pub fn push(&mut self, row: &[f32]) {
        debug_assert_eq!(row.len(), self.width);
        self.data.extend_from_slice(row);
        self.n += 1;
    }
    pub fn row(&self, i: usize) -> &[f32] { &self.data[i * self.width..(i + 1) * self.width] }
    pub fn truncate(&mut self, n: usize) {
        self.n = n.min(self.n);
        self.data.truncate(self.n * self.width);
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct LayerKv {
    pub ratio: usize,
    /// Ring of `swa` rows: position p lives at row p % swa.
    pub raw: Vec<f32>,
    pub comp: Option<Rows>,
    pub comp_state: Option<CompressorState>,
    pub idx: Option<Rows>,
    pub idx_state: Option<CompressorState>,
}

/// The KV state of a stage: every owned layer, and the number of positions consumed.
#[derive(Debug, Clone, PartialEq)]
pub struct KvState {
    pub pos: usize,
    pub ctx: usize,
    pub first_layer: usize,
    pub layers: Vec<LayerKv>,
    /// While set, forward calls record what they overwrite, so that `rollback` can return to an
    /// earlier position (speculative verification). None otherwise (no cost on the plain path).
    pub journal: Option<Journal>,
    /// The device KV slot that holds this sequence on a GPU backend built with several (batched
    /// decode of several sessions); 0 otherwise. The CPU ignores it (the state is `layers`).
    pub slot: usize,
}

/// A buffer of a layer's state that a forward call overwrites in place.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Buf {
    Raw,
    CompKv,
    CompScore,
    IdxKv,
    IdxScore,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Entry {
    pos: usize,
    layer: usize,
    buf: Buf,
    start: usize,
    len: usize,
}

/// Undo log of forward calls since `KvState::begin_journal`: the old values of every in-place write
/// (ring rows, compressor and indexer frontiers), tagged with the position that wrote them, in the
/// order written. Appended
/// rows (compressed, indexer) need no log: their count follows from the position.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Journal {
    from: usize,
    entries: Vec<Entry>,
    data: Vec<f32>,
}

impl Journal {
    /// Saves `src[start..start + len]` before position `pos` overwrites it in `layer`'s `buf`.
    pub fn save(&mut self, pos: usize, layer: usize, buf: Buf, src: &[f32], start: usize, len: usize) {
        self.entries.push(Entry { pos, layer, buf, start, len });
        self.data.extend_from_slice(&src[start..start + len]);
    }
}

impl LayerKv {
    fn buf_mut(&mut self, b: Buf) -> Option<&mut Vec<f32>> {
        match b {
            Buf::Raw => Some(&mut self.raw),
            Buf::CompKv => self.comp_state.as_mut().map(|s| &mut s.kv),
            Buf::CompScore => self.comp_state.as_mut().map(|s| &mut s.score),
            Buf::IdxKv => self.idx_state.as_mut().map(|s| &mut s.kv),
            Buf::IdxScore => self.idx_state.as_mut().map(|s| &mut s.score),
        }
    }
}

impl KvState {
    pub fn new(cfg: &Config, range: LayerRange, ctx: usize) -> Self {
        let layers = (range.first..=range.last)
            .map(|il| {
                let ratio = cfg.ratio(il);
                let coff = cfg.compress_coff(il);
                let cap = compressed_capacity(ctx, ratio);
                LayerKv {
                    ratio,
                    raw: vec![0.0; cfg.swa * cfg.head_dim],
                    comp: (ratio != 0).then(|| Rows::with_capacity(cfg.head_dim, cap)),
                    comp_state: (ratio != 0).then(|| CompressorState::new(ratio, coff, cfg.head_dim)),
                    idx: (ratio == 4).then(|| Rows::with_capacity(cfg.idx_dim, cap)),
                    idx_state: (ratio == 4).then(|| CompressorState::new(ratio, coff, cfg.idx_dim)),
                }
            })
            .collect();
        Self { pos: 0, ctx, first_layer: range.first, layers, journal: None, slot: 0 }
    }

    pub fn layer(&mut self, il: usize) -> &mut LayerKv { &mut self.layers[il - self.first_layer] }

    /// Layer `il`'s state and the journal, if one is recording (borrowed apart).
    pub fn layer_journal(&mut self, il: usize) -> (&mut LayerKv, Option<&mut Journal>) {
        (&mut self.layers[il - self.first_layer], self.journal.as_mut())
    }

    /// Starts recording at the current position: later forward calls can be undone with `rollback`.
    /// Restarts the log if one was running.
    pub fn begin_journal(&mut self) {
        let mut j = self.journal.take().unwrap_or_default();
        j.from = self.pos;
        j.entries.clear();
        j.data.clear();
        self.journal = Some(j);
    }

    /// Stops recording (keeps the state as it is).
    pub fn end_journal(&mut self) {
        self.journal = None;
    }

    /// Returns the state to position `to` (between the position `begin_journal` was called at and the
    /// current one): restores every overwritten value written at positions >= `to`, drops compressed and
    /// indexer rows of windows that closed at or after `to`. The result equals the state a forward of
    /// only the first `to` positions would have left. The journal keeps recording from `to`.
    pub fn rollback(&mut self, to: usize) -> Result<(), String> {
        let Some(mut j) = self.journal.take() else { return Err("rollback without a journal".into()) };
        if to < j.from || to > self.pos {
            let from = j.from;
            self.journal = Some(j);
            return Err(format!("rollback to {to} outside the journal's positions {from}..={}", self.pos));
        }
        // Undo in reverse order of writing (a location written twice gets its oldest value back).
        let mut end = j.data.len();
        for e in j.entries.iter().rev() {
            end -= e.len;
            if e.pos >= to {
                if let Some(b) = self.layers[e.layer].buf_mut(e.buf) {
                    b[e.start..e.start + e.len].copy_from_slice(&j.data[end..end + e.len]);
                }
            }
        }
        // Keep the log of positions before `to` (entries are ordered by layer, then position).
        let (mut src, mut dst) = (0, 0);
        let mut kept = Vec::with_capacity(j.entries.len());
        for e in &j.entries {
            if e.pos < to {
                j.data.copy_within(src..src + e.len, dst);
                dst += e.len;
                kept.push(*e);
            }
            src += e.len;
        }
        j.entries = kept;
        j.data.truncate(dst);
        for l in &mut self.layers {
            if l.ratio != 0 {
                let n = to / l.ratio;
                if let Some(c) = l.comp.as_mut() {
                    c.truncate(n);
                }
                if let Some(c) = l.idx.as_mut() {
                    c.truncate(n);
                }
            }
        }
        self.pos = to;
        self.journal = Some(j);
        Ok(())
    }

    /// Bytes held by the state (what a snapshot copies).
    pub fn bytes(&self) -> usize {
        self.layers
            .iter()
            .map(|l| {
                l.raw.len() * 4
                    + l.comp.as_ref().map_or(0, |r| r.data.len() * 4)
                    + l.idx.as_ref().map_or(0, |r| r.data.len() * 4)
                    + l.comp_state.as_ref().map_or(0, |s| s.bytes())
                    + l.idx_state.as_ref().map_or(0, |s| s.bytes())
            })
            .sum()
    }
}

/// Compressed rows a layer can hold for `ctx` positions (one per completed window, plus slack).
pub fn compressed_capacity(ctx: usize, ratio: usize) -> usize {
    if ratio == 0 { 0 } else { ctx / ratio + 2 }
}

/// Bytes the KV state of a layer range takes for `ctx`: the same formulas `KvState::new` allocates with.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KvBytes {
    pub raw: u64,
    pub compressed: u64,
    pub indexer: u64,
    pub compressor_state: u64,
}

impl KvBytes {
    pub fn total(&self) -> u64 { self.raw + self.compressed + self.indexer + self.compressor_state }
}

pub fn kv_bytes(cfg: &Config, range: LayerRange, ctx: usize) -> KvBytes {
    let mut b = KvBytes::default();
    for il in range.first..=range.last {
        let ratio = cfg.ratio(il);
        let coff = cfg.compress_coff(il) as u64;
        b.raw += (cfg.swa * cfg.head_dim * 4) as u64;
        if ratio != 0 {
            let cap = compressed_capacity(ctx, ratio) as u64;
            b.compressed += cap * cfg.head_dim as u64 * 4;
            b.compressor_state += 2 * compressor_rows(ratio) as u64 * coff * cfg.head_dim as u64 * 4;
        }
        if ratio == 4 {
            let cap = compressed_capacity(ctx, ratio) as u64;
            b.indexer += cap * cfg.idx_dim as u64 * 4;
            b.compressor_state += 2 * compressor_rows(ratio) as u64 * coff * cfg.idx_dim as u64 * 4;
        }
    }
    b
}
