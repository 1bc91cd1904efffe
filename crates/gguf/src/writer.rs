use crate::reader::{align_up, tensor_n_bytes, DEFAULT_ALIGNMENT, GGUF_MAGIC, GGUF_VERSION, MAX_ARRAY_DEPTH};
use crate::{GgmlType, GgufError, MetaValue};
use std::collections::HashSet;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

const ALIGN_KEY: &str = "general.alignment";

/// (name, offset relative to the data section, bytes)
type Span = (String, u64, u64);

struct TensorDecl {
    name: String,
    ty: GgmlType,
    dims: Vec<u64>,
    n_bytes: u64,
}

/// Two-phase GGUF v3 writer: declare metadata and tensors, then stream tensor bytes in declaration order
/// (so multi-GB synthetic models never sit in memory).
///
/// `add_kv` and `set_alignment` cannot fail on the spot; a bad value (duplicate key, array whose elements
/// do not match its element type, alignment not a power of two) is remembered and reported by `begin`.
/// `set_alignment` also writes `general.alignment` (u32) when the alignment is not the default 32.
///
/// The file is written to `<path>.tmp` and renamed to `<path>` by `TensorStream::finish` after fsync, so an
/// interrupted write never leaves a plausible-looking file at `path`.
pub struct GgufWriter {
    alignment: Option<u64>,
    kv: Vec<(String, MetaValue)>,
    keys: HashSet<String>,
    tensors: Vec<TensorDecl>,
    names: HashSet<String>,
    deferred: Option<GgufError>,
}

impl Default for GgufWriter {
    fn default() -> Self {
        Self::new()
    }
}

impl GgufWriter {
    pub fn new() -> Self {
        GgufWriter {
            alignment: None,
            kv: Vec::new(),
            keys: HashSet::new(),
            tensors: Vec::new(),
            names: HashSet::new(),
            deferred: None,
        }
    }

    fn defer(&mut self, e: GgufError) {
        if self.deferred.is_none() {
            self.deferred = Some(e);
        }
    }

    pub fn set_alignment(&mut self, align: u64) {
        if align == 0 || !align.is_power_of_two() || align > u32::MAX as u64 {
            self.defer(GgufError::Meta {
                key: ALIGN_KEY.into(),
                problem: format!("alignment {align} must be a non-zero power of two that fits in u32"),
            });
            return;
        }
        self.alignment = Some(align);
    }

    pub fn add_kv(&mut self, key: &str, value: MetaValue) {
        if !self.keys.insert(key.to_string()) {
            self.defer(GgufError::Meta { key: key.into(), problem: "duplicate metadata key".into() });
            return;
        }
        if let Err(problem) = check_value(&value, 0) {
            self.defer(GgufError::Meta { key: key.into(), problem });
            return;
        }
        if key == ALIGN_KEY {
            match value.as_u32() {
                Some(a) if a != 0 && a.is_power_of_two() => {}
                _ => self.defer(GgufError::Meta {
                    key: key.into(),
                    problem: format!("alignment {value} must be a non-zero power of two (u32)"),
                }),
            }
        }
        self.kv.push((key.to_string(), value));
    }

    /// Declare a tensor; its byte size is computed from type and dims.
    pub fn add_tensor_info(&mut self, name: &str, ty: GgmlType, dims: &[u64]) -> Result<(), GgufError> {
        let terr = |problem: String| GgufError::Tensor { name: name.to_string(), problem };
        let n_bytes = tensor_n_bytes(ty, dims).map_err(terr)?;
        if !self.names.insert(name.to_string()) {
            return Err(terr("duplicate tensor name".into()));
        }
        self.tensors.push(TensorDecl { name: name.to_string(), ty, dims: dims.to_vec(), n_bytes });
        Ok(())
    }

    /// Number of tensors declared so far.
    pub fn n_tensors(&self) -> usize {
        self.tensors.len()
    }

    /// Alignment the file will use (explicit, from a `general.alignment` kv, or the default 32).
    pub fn alignment(&self) -> u64 {
        match self.alignment {
            Some(a) => a,
            None => self
                .kv
                .iter()
                .find(|(k, _)| k == ALIGN_KEY)
                .and_then(|(_, v)| v.as_u32())
                .filter(|a| *a != 0 && a.is_power_of_two())
                .map(u64::from)
                .unwrap_or(DEFAULT_ALIGNMENT),
        }
    }

    /// Header + metadata + tensor directory + padding to the data section, and the tensors' spans
    /// (offset relative to the data section, bytes).
    fn encode_head(&mut self) -> Result<(Vec<u8>, Vec<Span>, u64), GgufError> {
        if let Some(e) = self.deferred.take() {
            return Err(e);
        }
        let align = self.alignment();
        if let Some(a) = self.alignment {
            match self.kv.iter_mut().find(|(k, _)| k == ALIGN_KEY) {
                Some((_, v)) => *v = MetaValue::U32(a as u32),
                None if a != DEFAULT_ALIGNMENT => self.kv.push((ALIGN_KEY.into(), MetaValue::U32(a as u32))),
                None => {}
            }
        }
        let mut out = Vec::with_capacity(4096);
        out.extend_from_slice(&GGUF_MAGIC);
        out.extend_from_slice(&GGUF_VERSION.to_le_bytes());
        out.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        out.extend_from_slice(&(self.kv.len() as u64).to_le_bytes());
        for (k, v) in &self.kv {
            put_str(&mut out, k);
            out.extend_from_slice(&(v.meta_type() as u32).to_le_bytes());
            put_value(&mut out, v);
        }
        let mut spans = Vec::with_capacity(self.tensors.len());
        let mut pos = 0u64;
        for t in &self.tensors {
            let offset = align_up(pos, align).ok_or_else(|| GgufError::Tensor {
                name: t.name.clone(),
                problem: "data offset overflows".into(),
            })?;
            pos = offset.checked_add(t.n_bytes).ok_or_else(|| GgufError::Tensor {
                name: t.name.clone(),
                problem: "data end overflows".into(),
            })?;
            put_str(&mut out, &t.name);
            out.extend_from_slice(&(t.dims.len() as u32).to_le_bytes());
            for d in &t.dims {
                out.extend_from_slice(&d.to_le_bytes());
            }
            out.extend_from_slice(&(t.ty as u32).to_le_bytes());
            out.extend_from_slice(&offset.to_le_bytes());
            spans.push((t.name.clone(), offset, t.n_bytes));
        }
        let data_start = align_up(out.len() as u64, align).expect("small");
        out.resize(data_start as usize, 0);
        Ok((out, spans, align))
    }

    /// Encode a complete file in memory (header, directory and the given tensor bytes in declaration
    /// order). Handy for tests and small fixtures.
    pub fn to_bytes(mut self, data: &[&[u8]]) -> Result<Vec<u8>, GgufError> {
        let (mut out, spans, align) = self.encode_head()?;
        if data.len() != spans.len() {
            return Err(GgufError::Invalid(format!(
                "{} tensors declared, {} data buffers given",
                spans.len(),
                data.len()
            )));
        }
        let base = out.len() as u64;
        for ((name, off, n), d) in spans.iter().zip(data) {
            if d.len() as u64 != *n {
                return Err(GgufError::Tensor {
                    name: name.clone(),
                    problem: format!("{} data bytes given, {n} declared", d.len()),
                });
            }
            out.resize((base + off) as usize, 0);
            out.extend_from_slice(d);
        }
        let end = align_up(out.len() as u64, align).expect("small");
        out.resize(end as usize, 0);
        Ok(out)
    }

    /// Write header + directory; returns the stream that takes tensor data in order.
    pub fn begin(mut self, path: impl AsRef<Path>) -> Result<TensorStream, GgufError> {
        let path = path.as_ref().to_path_buf();
        let (head, spans, align) = self.encode_head()?;
        let file_name = path.file_name().ok_or_else(|| GgufError::Io {
            path: path.display().to_string(),
            source: std::io::Error::new(std::io::ErrorKind::InvalidInput, "path has no file name"),
        })?;
        let mut tmp_name = file_name.to_os_string();
        tmp_name.push(".tmp");
        let tmp_path = path.with_file_name(tmp_name);
        let io = |p: &Path, source| GgufError::Io { path: p.display().to_string(), source };
        // The finished file is renamed over `path`: never over a directory, device, FIFO or socket
        // (e.g. /dev/null given as a place to discard the output), and before anything is written.
        if std::fs::metadata(&path).is_ok_and(|m| !m.is_file()) {
            return Err(io(&path, std::io::Error::other("exists and is not a regular file (it is not replaced)")));
        }
        let file = File::create(&tmp_path).map_err(|e| io(&tmp_path, e))?;
        let mut stream = TensorStream {
            out: Some(BufWriter::with_capacity(8 << 20, file)),
            tmp_path,
            path,
            spans,
            align,
            cur: 0,
            written: 0,
            pos: 0,
            poisoned: false,
        };
        stream.raw_write(&head)?;
        stream.settle()?;
        Ok(stream)
    }
}

/// Validate a value before it is stored: array elements must match the declared element type and
/// nesting must stay within what the reader accepts. Returns a problem description.
fn check_value(v: &MetaValue, depth: usize) -> Result<(), String> {
    if let MetaValue::Array(et, items) = v {
        if depth >= MAX_ARRAY_DEPTH {
            return Err(format!("arrays nested deeper than {MAX_ARRAY_DEPTH} levels"));
        }
        for (i, it) in items.iter().enumerate() {
            if it.meta_type() != *et {
                return Err(format!(
                    "array element {i} has type {}, but the array is declared array<{et}>",
                    it.meta_type()
                ));
            }
            check_value(it, depth + 1).map_err(|e| format!("array element {i}: {e}"))?;
        }
    }
    Ok(())
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

/// Value payload without its type id (arrays: element type, count, elements; nested arrays the same,
/// recursively — the layout of gguf-py and ggml).
fn put_value(out: &mut Vec<u8>, v: &MetaValue) {
    match v {
        MetaValue::U8(x) => out.push(*x),
        MetaValue::I8(x) => out.push(*x as u8),
        MetaValue::U16(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::I16(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::U32(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::I32(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::F32(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::U64(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::I64(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::F64(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::Bool(b) => out.push(*b as u8),
        MetaValue::Str(s) => put_str(out, s),
        MetaValue::Array(et, items) => {
            out.extend_from_slice(&(*et as u32).to_le_bytes());
            out.extend_from_slice(&(items.len() as u64).to_le_bytes());
            for it in items {
                put_value(out, it);
            }
        }
    }
}

/// Receives the bytes of each declared tensor in order; may be called several times per tensor
/// (chunks) — the tensor is complete when its declared byte count is reached.
pub struct TensorStream {
    out: Option<BufWriter<File>>,
    tmp_path: PathBuf,
    path: PathBuf,
    spans: Vec<Span>,
    align: u64,
    /// Index of the first tensor not yet complete.
    cur: usize,
    /// Bytes of tensor `cur` written so far.
    written: u64,
    /// Bytes written after the start of the data section (after the head: padding + data).
    pos: u64,
    poisoned: bool,
}

impl TensorStream {
    fn io_err(&self, source: std::io::Error) -> GgufError {
        GgufError::Io { path: self.tmp_path.display().to_string(), source }
    }

    fn raw_write(&mut self, bytes: &[u8]) -> Result<(), GgufError> {
        let res = match self.out.as_mut() {
            Some(o) => o.write_all(bytes),
            None => Err(std::io::Error::other("stream already closed")),
        };
        res.map_err(|e| {
            self.poisoned = true;
            self.io_err(e)
        })
    }

    fn pad_to(&mut self, target: u64) -> Result<(), GgufError> {
        const ZEROS: [u8; 4096] = [0; 4096];
        while self.pos < target {
            let n = (target - self.pos).min(ZEROS.len() as u64) as usize;
            self.raw_write(&ZEROS[..n])?;
            self.pos += n as u64;
        }
        Ok(())
    }

    /// Skip completed (and zero-sized) tensors and write the padding up to the next one's offset.
    fn settle(&mut self) -> Result<(), GgufError> {
        loop {
            if self.cur >= self.spans.len() {
                return Ok(());
            }
            let (_, off, n) = self.spans[self.cur];
            if self.written == 0 {
                self.pad_to(off)?;
            }
            if self.written < n {
                return Ok(());
            }
            self.cur += 1;
            self.written = 0;
        }
    }

    /// Name of the tensor the next bytes belong to (None when all are complete).
    pub fn current_tensor(&self) -> Option<&str> {
        self.spans.get(self.cur).map(|(n, _, _)| n.as_str())
    }

    pub fn write(&mut self, mut bytes: &[u8]) -> Result<(), GgufError> {
        if self.poisoned {
            return Err(GgufError::Invalid("GGUF stream unusable after an earlier write error".into()));
        }
        while !bytes.is_empty() {
            let Some((_, _, n)) = self.spans.get(self.cur).cloned() else {
                return Err(GgufError::Invalid(format!(
                    "{} bytes of tensor data beyond the last declared tensor",
                    bytes.len()
                )));
            };
            let take = ((n - self.written).min(bytes.len() as u64)) as usize;
            let (head, rest) = bytes.split_at(take);
            self.raw_write(head)?;
            self.written += take as u64;
            self.pos += take as u64;
            bytes = rest;
            self.settle()?;
        }
        Ok(())
    }

    /// Checks that every tensor got exactly its bytes, flushes and fsyncs.
    pub fn finish(mut self) -> Result<(), GgufError> {
        if self.poisoned {
            return Err(GgufError::Invalid("GGUF stream unusable after an earlier write error".into()));
        }
        if let Some((name, _, n)) = self.spans.get(self.cur).cloned() {
            return Err(GgufError::Tensor {
                name,
                problem: format!(
                    "incomplete: got {} of {n} bytes ({} tensors still missing data)",
                    self.written,
                    self.spans.len() - self.cur
                ),
            });
        }
        let end = align_up(self.pos, self.align).expect("file end overflows");
        self.pad_to(end)?;
        let out = self.out.take().expect("stream open");
        let file = out.into_inner().map_err(|e| {
            GgufError::Io { path: self.tmp_path.display().to_string(), source: e.into_error() }
        })?;
        file.sync_all().map_err(|e| self.io_err(e))?;
        drop(file);
        std::fs::rename(&self.tmp_path, &self.path)
            .map_err(|e| GgufError::Io { path: self.path.display().to_string(), source: e })?;
        // Make the rename durable; a failure here is not fatal to the data just written.
        if let Some(dir) = self.path.parent() {
            let dir = if dir.as_os_str().is_empty() { Path::new(".") } else { dir };
            if let Ok(d) = File::open(dir) {
                let _ = d.sync_all();
            }
        }
        self.tmp_path = PathBuf::new();
        Ok(())
    }
}

impl Drop for TensorStream {
    /// An unfinished stream removes its temporary file.
    fn drop(&mut self) {
        if let Some(out) = self.out.take() {
            drop(out);
            if !self.tmp_path.as_os_str().is_empty() {
                let _ = std::fs::remove_file(&self.tmp_path);
            }
        }
    }
}
