//! The cache file format (version 1). All integers little-endian.
//!
//! ```text
//! header (128 bytes)
//!   0  magic  "DS4KVC\r\n"
//!   8  u32    format version
//!  12  u32    save reason
//!  16  [32]   model identity (sha256 of the GGUF metadata, tensor table and numerics options)
//!  48  u64    first layer
//!  56  u64    layer count
//!  64  u64    ctx the state was built for
//!  72  u64    token count
//!  80  u64    body length in bytes
//!  88  [32]   sha256 of the body
//! 120  u64    tool map length in bytes
//! head checksum (32 bytes): sha256 of the header, the token ids and the tool map
//! token ids (u32 × token count)
//! tool map: u64 count; count × { u64 len; id bytes; u64 len; DSML bytes }
//! body (checksummed)
//!   u64 pos; u64 n_logits; f32 × n_logits (logits after the last token)
//!   per layer: u64 ratio; u64 flags (1 comp, 2 comp_state, 4 idx, 8 idx_state);
//!              u64 n; f32 × n (raw sliding window ring, as held);
//!              [comp rows: u64 width; u64 rows; f32 × width·rows]
//!              [comp frontier: u64 ratio; u64 width; u64 n; f32 × n (kv); u64 n; f32 × n (score)]
//!              [indexer rows] [indexer frontier], same encodings
//! ```
//!
//! The header, token ids and tool map carry their own checksum so the index (and the tool-id map a
//! request needs before any KV is loaded) can be rebuilt at start-up by reading only the front of each
//! file; the body is verified on load. Nothing read is trusted before its checksum
//! matches, and every length is checked against the bytes actually present and the expected shapes.
use ds4_model::kv::{CompressorState, LayerKv, Rows};
use ds4_model::KvState;
use sha2::{Digest, Sha256};
use std::fmt;
use std::io::{Read, Write};
use std::path::Path;

pub const MAGIC: &[u8; 8] = b"DS4KVC\r\n";
pub const VERSION: u32 = 1;
pub const HEADER_LEN: usize = 128;
/// Header plus its checksum: what precedes the token ids.
pub const FRONT_LEN: usize = HEADER_LEN + 32;

/// Why a file was written (kept in the header; informational).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    Unknown = 0,
    Cold = 1,
    Continued = 2,
    Evict = 3,
    Shutdown = 4,
    Manual = 5,
}

impl Reason {
    pub fn name(self) -> &'static str {
        match self {
            Reason::Unknown => "unknown",
            Reason::Cold => "cold",
            Reason::Continued => "continued",
            Reason::Evict => "evict",
            Reason::Shutdown => "shutdown",
            Reason::Manual => "manual",
        }
    }
    fn from_u32(v: u32) -> Self {
        match v {
            1 => Reason::Cold,
            2 => Reason::Continued,
            3 => Reason::Evict,
            4 => Reason::Shutdown,
            5 => Reason::Manual,
            _ => Reason::Unknown,
        }
    }
}

/// What is wrong with a file. Every variant means "do not use it".
#[derive(Debug)]
pub enum FormatError {
    Io(std::io::Error),
    Truncated(String),
    BadMagic,
    Version(u32),
    OtherModel,
    Checksum(&'static str),
    Shape(String),
    TooLarge(u64),
}

impl fmt::Display for FormatError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FormatError::Io(e) => write!(f, "i/o error: {e}"),
            FormatError::Truncated(w) => write!(f, "truncated ({w})"),
            FormatError::BadMagic => write!(f, "not a DwarfStar KV cache file (bad magic)"),
            FormatError::Version(v) => write!(f, "format version {v}, this build reads version {VERSION}"),
            FormatError::OtherModel => write!(f, "written for another model or numerics options"),
            FormatError::Checksum(w) => write!(f, "checksum mismatch ({w})"),
            FormatError::Shape(w) => write!(f, "does not fit this model's KV layout: {w}"),
            FormatError::TooLarge(n) => write!(f, "implausible size {n}"),
        }
    }
}

impl std::error::Error for FormatError {}

impl From<std::io::Error> for FormatError {
    fn from(e: std::io::Error) -> Self {
        if e.kind() == std::io::ErrorKind::UnexpectedEof {
            FormatError::Truncated(e.to_string())
        } else {
            FormatError::Io(e)
        }
    }
}

/// Identity of a model for cache purposes: sha256 over every metadata key/value, the tensor table
/// (names, types, shapes, offsets), and `extra` (numerics options that change the KV contents).
pub fn model_identity(file: &ds4_gguf::GgufFile, extra: &str) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(b"ds4-kv-model-identity-v1\0");
    h.update((file.metadata().len() as u64).to_le_bytes());
    for (k, v) in file.metadata() {
        h.update((k.len() as u64).to_le_bytes());
        h.update(k.as_bytes());
        let s = format!("{v:?}");
        h.update((s.len() as u64).to_le_bytes());
        h.update(s.as_bytes());
    }
    h.update((file.tensors().len() as u64).to_le_bytes());
    for t in file.tensors() {
        h.update((t.name.len() as u64).to_le_bytes());
        h.update(t.name.as_bytes());
        h.update(t.ty.name().as_bytes());
        h.update((t.dims.len() as u64).to_le_bytes());
        for d in &t.dims {
            h.update(d.to_le_bytes());
        }
        h.update(t.offset.to_le_bytes());
        h.update(t.n_bytes.to_le_bytes());
    }
    h.update((extra.len() as u64).to_le_bytes());
    h.update(extra.as_bytes());
    h.finalize().into()
}

/// Identity of a loaded stage: its model file, numerics options and layer range. Server and CLI use this,
/// so their files are interchangeable.
pub fn stage_identity(stage: &ds4_model::Stage) -> [u8; 32] {
    // Steering changes the KV state; the plain model's identity is unchanged by this clause.
    let steer = stage.steering.as_ref().map(|s| format!(" steering {}", s.fingerprint())).unwrap_or_default();
    model_identity(&stage.w.file, &format!("{:?} {:?}{steer}", stage.opts, stage.w.range))
}

/// Cache key of a token prefix: sha256 of the ids.
pub fn token_key(tokens: &[u32]) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(b"ds4-kv-tokens-v1\0");
    for t in tokens {
        h.update(t.to_le_bytes());
    }
    h.finalize().into()
}

pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// A session's state to save.
pub struct StateRef<'a> {
    pub tokens: &'a [u32],
    pub kv: &'a KvState,
    pub logits: &'a [f32],
    /// Tool-call id → exact DSML of its block.
    pub tool_map: &'a [(String, String)],
}

/// The front of a file: what the index needs.
#[derive(Debug, Clone)]
pub struct Front {
    pub reason: Reason,
    pub first_layer: u64,
    pub n_layers: u64,
    pub ctx: u64,
    pub tokens: Vec<u32>,
    pub tool_map: Vec<(String, String)>,
    pub tool_map_len: u64,
    pub body_len: u64,
    pub body_sum: [u8; 32],
}

impl Front {
    /// Total file length this front describes.
    pub fn file_len(&self) -> u64 {
        FRONT_LEN as u64 + self.tokens.len() as u64 * 4 + self.tool_map_len + self.body_len
    }
}

fn put_u64(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&v.to_le_bytes());
}

fn put_f32s(out: &mut Vec<u8>, v: &[f32]) {
    put_u64(out, v.len() as u64);
    out.reserve(v.len() * 4);
    for x in v {
        out.extend_from_slice(&x.to_le_bytes());
    }
}

fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    put_u64(out, b.len() as u64);
    out.extend_from_slice(b);
}

fn put_comp(out: &mut Vec<u8>, s: &CompressorState) {
    put_u64(out, s.ratio as u64);
    put_u64(out, s.width as u64);
    put_f32s(out, &s.kv);
    put_f32s(out, &s.score);
}

fn put_rows(out: &mut Vec<u8>, r: &Rows) {
    put_u64(out, r.width as u64);
    put_u64(out, r.n as u64);
    let used = &r.data[..(r.n * r.width).min(r.data.len())];
    for x in used {
        out.extend_from_slice(&x.to_le_bytes());
    }
}

/// Serializes a state into the complete file bytes.
pub fn encode(model: &[u8; 32], reason: Reason, st: &StateRef) -> Vec<u8> {
    let mut body = Vec::with_capacity(st.kv.bytes() + st.logits.len() * 4 + 64);
    put_u64(&mut body, st.kv.pos as u64);
    put_f32s(&mut body, st.logits);
    for l in &st.kv.layers {
        put_u64(&mut body, l.ratio as u64);
        let flags = l.comp.is_some() as u64 | (l.comp_state.is_some() as u64) << 1 | (l.idx.is_some() as u64) << 2 | (l.idx_state.is_some() as u64) << 3;
        put_u64(&mut body, flags);
        put_f32s(&mut body, &l.raw);
        if let Some(r) = &l.comp {
            put_rows(&mut body, r);
        }
        if let Some(s) = &l.comp_state {
            put_comp(&mut body, s);
        }
        if let Some(r) = &l.idx {
            put_rows(&mut body, r);
        }
        if let Some(s) = &l.idx_state {
            put_comp(&mut body, s);
        }
    }
    let mut tools = Vec::new();
    put_u64(&mut tools, st.tool_map.len() as u64);
    for (id, dsml) in st.tool_map {
        put_bytes(&mut tools, id.as_bytes());
        put_bytes(&mut tools, dsml.as_bytes());
    }
    let body_sum: [u8; 32] = Sha256::digest(&body).into();

    let mut out = Vec::with_capacity(FRONT_LEN + st.tokens.len() * 4 + body.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&VERSION.to_le_bytes());
    out.extend_from_slice(&(reason as u32).to_le_bytes());
    out.extend_from_slice(model);
    put_u64(&mut out, st.kv.first_layer as u64);
    put_u64(&mut out, st.kv.layers.len() as u64);
    put_u64(&mut out, st.kv.ctx as u64);
    put_u64(&mut out, st.tokens.len() as u64);
    put_u64(&mut out, body.len() as u64);
    out.extend_from_slice(&body_sum);
    put_u64(&mut out, tools.len() as u64);
    debug_assert_eq!(out.len(), HEADER_LEN);
    let mut toks = Vec::with_capacity(st.tokens.len() * 4);
    for t in st.tokens {
        toks.extend_from_slice(&t.to_le_bytes());
    }
    let mut h = Sha256::new();
    h.update(&out);
    h.update(&toks);
    h.update(&tools);
    let head_sum: [u8; 32] = h.finalize().into();
    out.extend_from_slice(&head_sum);
    out.extend_from_slice(&toks);
    out.extend_from_slice(&tools);
    out.extend_from_slice(&body);
    out
}

/// Largest token count a front may claim (guards allocations before the checksum is known).
const MAX_TOKENS: u64 = 1 << 26;

/// Reads and verifies the header and token ids from `r`, a file of `file_len` bytes.
pub fn read_front(r: &mut impl Read, file_len: u64, model: &[u8; 32]) -> Result<Front, FormatError> {
    let mut hdr = [0u8; HEADER_LEN];
    r.read_exact(&mut hdr).map_err(|e| match e.kind() {
        std::io::ErrorKind::UnexpectedEof => FormatError::Truncated("header".into()),
        _ => FormatError::Io(e),
    })?;
    if &hdr[0..8] != MAGIC {
        return Err(FormatError::BadMagic);
    }
    let u32_at = |o: usize| u32::from_le_bytes(hdr[o..o + 4].try_into().unwrap());
    let u64_at = |o: usize| u64::from_le_bytes(hdr[o..o + 8].try_into().unwrap());
    let version = u32_at(8);
    let mut head_sum = [0u8; 32];
    r.read_exact(&mut head_sum).map_err(|_| FormatError::Truncated("header checksum".into()))?;
    let n_tokens = u64_at(72);
    if n_tokens > MAX_TOKENS || FRONT_LEN as u64 + n_tokens * 4 > file_len {
        // Checked before the checksum only to bound the allocation; a valid file never gets here.
        return Err(FormatError::Truncated(format!("header claims {n_tokens} token ids, the file has {file_len} bytes")));
    }
    let mut toks = vec![0u8; n_tokens as usize * 4];
    r.read_exact(&mut toks).map_err(|_| FormatError::Truncated("token ids".into()))?;
    let tools_len = u64_at(120);
    if tools_len > file_len - FRONT_LEN as u64 - n_tokens * 4 {
        return Err(FormatError::Truncated(format!("header claims a {tools_len}-byte tool map, the file has {file_len} bytes")));
    }
    let mut tools = vec![0u8; tools_len as usize];
    r.read_exact(&mut tools).map_err(|_| FormatError::Truncated("tool map".into()))?;
    let mut h = Sha256::new();
    h.update(hdr);
    h.update(&toks);
    h.update(&tools);
    let sum: [u8; 32] = h.finalize().into();
    if sum != head_sum {
        return Err(FormatError::Checksum("header, token ids and tool map"));
    }
    // The header is intact: now its fields can be believed.
    if version != VERSION {
        return Err(FormatError::Version(version));
    }
    if &hdr[16..48] != model {
        return Err(FormatError::OtherModel);
    }
    let tokens = toks.chunks_exact(4).map(|c| u32::from_le_bytes(c.try_into().unwrap())).collect();
    let mut c = Cur { b: &tools, at: 0 };
    let n = c.len("tool map", 16)?;
    let mut tool_map = Vec::with_capacity(n);
    for _ in 0..n {
        let id = c.string("tool id")?;
        let dsml = c.string("tool DSML")?;
        tool_map.push((id, dsml));
    }
    if c.at != tools.len() {
        return Err(FormatError::Shape("trailing bytes after the tool map".into()));
    }
    Ok(Front {
        tool_map,
        tool_map_len: tools_len,
        reason: Reason::from_u32(u32_at(12)),
        first_layer: u64_at(48),
        n_layers: u64_at(56),
        ctx: u64_at(64),
        tokens,
        body_len: u64_at(80),
        body_sum: hdr[88..120].try_into().unwrap(),
    })
}

/// Bounds-checked reader over the body.
struct Cur<'a> {
    b: &'a [u8],
    at: usize,
}

impl<'a> Cur<'a> {
    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8], FormatError> {
        if self.b.len() - self.at < n {
            return Err(FormatError::Truncated(format!("body ends inside {what}")));
        }
        let s = &self.b[self.at..self.at + n];
        self.at += n;
        Ok(s)
    }
    fn u64(&mut self, what: &str) -> Result<u64, FormatError> {
        Ok(u64::from_le_bytes(self.take(8, what)?.try_into().unwrap()))
    }
    fn len(&mut self, what: &str, elem: usize) -> Result<usize, FormatError> {
        let n = self.u64(what)?;
        let avail = ((self.b.len() - self.at) / elem.max(1)) as u64;
        if n > avail {
            return Err(FormatError::Truncated(format!("{what} claims {n} items, {avail} present")));
        }
        Ok(n as usize)
    }
    /// Reads exactly `n` floats into `dst` (cleared first, capacity kept).
    fn f32s_into(&mut self, n: usize, dst: &mut Vec<f32>, what: &str) -> Result<(), FormatError> {
        let bytes = self.take(n.checked_mul(4).ok_or(FormatError::TooLarge(n as u64))?, what)?;
        dst.clear();
        dst.extend(bytes.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())));
        Ok(())
    }
    fn f32s_exact(&mut self, dst: &mut Vec<f32>, want: usize, what: &str) -> Result<(), FormatError> {
        let n = self.len(what, 4)?;
        if n != want {
            return Err(FormatError::Shape(format!("{what}: {n} values, expected {want}")));
        }
        self.f32s_into(n, dst, what)
    }
    fn string(&mut self, what: &str) -> Result<String, FormatError> {
        let n = self.len(what, 1)?;
        let b = self.take(n, what)?;
        String::from_utf8(b.to_vec()).map_err(|_| FormatError::Shape(format!("{what} is not UTF-8")))
    }
}

fn read_comp(c: &mut Cur, dst: &mut CompressorState, what: &str) -> Result<(), FormatError> {
    let ratio = c.u64(what)?;
    let width = c.u64(what)?;
    if ratio != dst.ratio as u64 || width != dst.width as u64 {
        return Err(FormatError::Shape(format!("{what}: ratio {ratio} width {width}, expected {} {}", dst.ratio, dst.width)));
    }
    let (nk, ns) = (dst.kv.len(), dst.score.len());
    c.f32s_exact(&mut dst.kv, nk, what)?;
    c.f32s_exact(&mut dst.score, ns, what)
}

fn read_rows(c: &mut Cur, dst: &mut Rows, max_rows: usize, what: &str) -> Result<(), FormatError> {
    let width = c.u64(what)?;
    let n = c.u64(what)?;
    if width != dst.width as u64 {
        return Err(FormatError::Shape(format!("{what}: width {width}, expected {}", dst.width)));
    }
    if n > max_rows as u64 {
        return Err(FormatError::Shape(format!("{what}: {n} rows, at most {max_rows} fit")));
    }
    let n = n as usize;
    c.f32s_into(n * dst.width, &mut dst.data, what)?;
    dst.n = n;
    Ok(())
}

/// Parses a verified body into `kv` (whose layout — layers, ratios, widths, window — is the template the
/// data must match) and `logits`. On error `kv` may be partly overwritten: the caller must reset it.
fn decode_body(body: &[u8], front: &Front, kv: &mut KvState, logits: &mut Vec<f32>, vocab: Option<usize>) -> Result<(), FormatError> {
    if front.first_layer != kv.first_layer as u64 || front.n_layers != kv.layers.len() as u64 {
        return Err(FormatError::Shape(format!(
            "layers {}+{}, this process owns {}+{}",
            front.first_layer,
            front.n_layers,
            kv.first_layer,
            kv.layers.len()
        )));
    }
    let n_tok = front.tokens.len();
    if n_tok > kv.ctx {
        return Err(FormatError::Shape(format!("{n_tok} tokens do not fit ctx {}", kv.ctx)));
    }
    let mut c = Cur { b: body, at: 0 };
    let pos = c.u64("pos")?;
    if pos != n_tok as u64 {
        return Err(FormatError::Shape(format!("pos {pos} differs from the {n_tok} token ids")));
    }
    let nl = c.len("logits", 4)?;
    if let Some(v) = vocab {
        if nl != v && nl != 0 {
            return Err(FormatError::Shape(format!("{nl} logits, vocabulary has {v}")));
        }
    }
    if n_tok > 0 && nl == 0 && vocab.is_some() {
        return Err(FormatError::Shape("no logits saved".into()));
    }
    c.f32s_into(nl, logits, "logits")?;
    let ctx = kv.ctx;
    for (i, l) in kv.layers.iter_mut().enumerate() {
        let LayerKv { ratio, raw, comp, comp_state, idx, idx_state } = l;
        let il = kv.first_layer + i;
        let r = c.u64("layer ratio")?;
        let flags = c.u64("layer flags")?;
        let want = comp.is_some() as u64 | (comp_state.is_some() as u64) << 1 | (idx.is_some() as u64) << 2 | (idx_state.is_some() as u64) << 3;
        if r != *ratio as u64 || flags != want {
            return Err(FormatError::Shape(format!("layer {il}: ratio {r} flags {flags}, expected {ratio} {want}")));
        }
        let nraw = raw.len();
        c.f32s_exact(raw, nraw, &format!("layer {il} raw window"))?;
        // A layer of ratio r holds about one compressed row per window of the tokens seen.
        let max_rows = ds4_model::kv::compressed_capacity(n_tok, *ratio).min(ds4_model::kv::compressed_capacity(ctx, *ratio));
        if let Some(rows) = comp {
            read_rows(&mut c, rows, max_rows, &format!("layer {il} compressed rows"))?;
        }
        if let Some(s) = comp_state {
            read_comp(&mut c, s, &format!("layer {il} compressor frontier"))?;
        }
        if let Some(rows) = idx {
            read_rows(&mut c, rows, max_rows, &format!("layer {il} indexer rows"))?;
        }
        if let Some(s) = idx_state {
            read_comp(&mut c, s, &format!("layer {il} indexer frontier"))?;
        }
    }
    if c.at != body.len() {
        return Err(FormatError::Shape(format!("{} trailing bytes", body.len() - c.at)));
    }
    kv.pos = n_tok;
    Ok(())
}

/// A state read back from a file.
#[derive(Debug)]
pub struct Restored {
    pub tokens: Vec<u32>,
    pub tool_map: Vec<(String, String)>,
    pub reason: Reason,
}

/// Reads a whole file from `r` (of length `file_len`), verifies both checksums and the layout against
/// `kv`, and fills `kv` and `logits`. `vocab`: the expected logits length (None: not checked).
/// On error `kv`/`logits` may be partly overwritten; the caller must reset them.
pub fn decode_from(
    r: &mut impl Read,
    file_len: u64,
    model: &[u8; 32],
    kv: &mut KvState,
    logits: &mut Vec<f32>,
    vocab: Option<usize>,
) -> Result<Restored, FormatError> {
    let front = read_front(r, file_len, model)?;
    if front.file_len() != file_len {
        return Err(FormatError::Truncated(format!("file has {file_len} bytes, header describes {}", front.file_len())));
    }
    // The header is checksummed and the length matches the file: the allocation is as big as the file.
    let mut body = vec![0u8; front.body_len as usize];
    r.read_exact(&mut body).map_err(|_| FormatError::Truncated("body".into()))?;
    let sum: [u8; 32] = Sha256::digest(&body).into();
    if sum != front.body_sum {
        return Err(FormatError::Checksum("body"));
    }
    decode_body(&body, &front, kv, logits, vocab)?;
    Ok(Restored { tokens: front.tokens, tool_map: front.tool_map, reason: front.reason })
}

/// Writes `bytes` to `path` atomically: a temporary file in the same directory, fsync, rename, and an
/// fsync of the directory. The temporary name starts with `.` and contains `.tmp`.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    // The rename replaces what is at `path`: only ever a regular file (never a directory, device,
    // FIFO or socket, e.g. `--kv-save /dev/null`).
    if std::fs::metadata(path).is_ok_and(|m| !m.is_file()) {
        return Err(std::io::Error::other(format!("{} exists and is not a regular file (it is not replaced)", path.display())));
    }
    let dir = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("kv");
    let tmp = dir.join(format!(".{name}.tmp{}", std::process::id()));
    let res = (|| {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        drop(f);
        std::fs::rename(&tmp, path)?;
        if let Ok(d) = std::fs::File::open(dir) {
            let _ = d.sync_all();
        }
        Ok(())
    })();
    if res.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    res
}

/// Saves one session to `path` (the CLI's `--kv-save`).
pub fn save_file(path: &Path, model: &[u8; 32], reason: Reason, st: &StateRef) -> std::io::Result<u64> {
    let bytes = encode(model, reason, st);
    write_atomic(path, &bytes)?;
    Ok(bytes.len() as u64)
}

/// Loads one session from `path` (the CLI's `--kv-load`); see [`decode_from`].
pub fn load_file(path: &Path, model: &[u8; 32], kv: &mut KvState, logits: &mut Vec<f32>, vocab: Option<usize>) -> Result<Restored, FormatError> {
    let f = std::fs::File::open(path)?;
    let len = f.metadata()?.len();
    let mut r = std::io::BufReader::new(f);
    decode_from(&mut r, len, model, kv, logits, vocab)
}
