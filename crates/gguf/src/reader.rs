use crate::{GgmlType, GgufError, MetaType, MetaValue};
use std::collections::HashMap;
use std::fs::File;
use std::path::Path;

/// GGUF magic bytes at offset 0.
pub const GGUF_MAGIC: [u8; 4] = *b"GGUF";
/// The only container version this crate reads and writes.
pub const GGUF_VERSION: u32 = 3;
/// Alignment of the data section and of every tensor when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// Largest number of dimensions of a tensor (ggml `GGML_MAX_DIMS`).
pub const MAX_DIMS: usize = 4;
/// Deepest nesting of arrays inside arrays the reader accepts (an array of arrays has depth 2).
pub const MAX_ARRAY_DEPTH: usize = 8;
/// Total number of metadata values (scalars plus array elements, all levels) the reader accepts.
/// Each parsed value takes ~32 bytes of memory, so this caps metadata memory at ~0.5 GiB whatever the
/// file says. A DeepSeek V4 file carries well under a million (tokenizer arrays).
pub const MAX_META_VALUES: u64 = 1 << 24;

/// One entry of the tensor directory.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorInfo {
    pub name: String,
    pub ty: GgmlType,
    /// GGUF order: dims[0] is the contiguous (input) dimension.
    pub dims: Vec<u64>,
    /// Byte offset relative to the start of the data section.
    pub offset: u64,
    pub n_bytes: u64,
}

impl TensorInfo {
    pub fn n_elems(&self) -> u64 { self.dims.iter().product() }
}

/// Byte size of a tensor of type `ty` with GGUF-order `dims`, checking that dims[0] is a whole number
/// of blocks and that nothing overflows (element count must fit in i64, as in ggml).
/// Errors are plain problem descriptions, without the tensor name.
pub fn tensor_n_bytes(ty: GgmlType, dims: &[u64]) -> Result<u64, String> {
    if dims.len() > MAX_DIMS {
        return Err(format!("{} dimensions (at most {MAX_DIMS})", dims.len()));
    }
    let mut n_elems: u64 = 1;
    for &d in dims {
        if d > i64::MAX as u64 {
            return Err(format!("dimension {d} out of range (dims {dims:?})"));
        }
        n_elems = n_elems
            .checked_mul(d)
            .filter(|&n| n <= i64::MAX as u64)
            .ok_or_else(|| format!("element count overflows (dims {dims:?})"))?;
    }
    let be = ty.block_elems() as u64;
    let bb = ty.block_bytes() as u64;
    let d0 = dims.first().copied().unwrap_or(1);
    if d0 % be != 0 {
        return Err(format!(
            "first dimension {d0} is not a multiple of the {} block size {be} (dims {dims:?})",
            ty.name()
        ));
    }
    // n_elems is a multiple of d0 and so of the block size.
    (n_elems / be)
        .checked_mul(bb)
        .ok_or_else(|| format!("byte size overflows (dims {dims:?})"))
}

pub(crate) fn align_up(x: u64, align: u64) -> Option<u64> {
    debug_assert!(align.is_power_of_two());
    x.checked_add(align - 1).map(|v| v & !(align - 1))
}

enum Backing {
    Mmap(memmap2::Mmap),
    Owned(Vec<u8>),
}

impl Backing {
    fn bytes(&self) -> &[u8] {
        match self {
            Backing::Mmap(m) => m,
            Backing::Owned(v) => v,
        }
    }
}

/// A parsed GGUF file backed by a memory map (or owned bytes, for tests and fuzzing).
pub struct GgufFile {
    backing: Backing,
    version: u32,
    alignment: u64,
    data_offset: u64,
    metadata: Vec<(String, MetaValue)>,
    meta_index: HashMap<String, usize>,
    tensors: Vec<TensorInfo>,
    tensor_index: HashMap<String, usize>,
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile")
            .field("len", &self.bytes().len())
            .field("version", &self.version)
            .field("alignment", &self.alignment)
            .field("data_offset", &self.data_offset)
            .field("n_kv", &self.metadata.len())
            .field("n_tensors", &self.tensors.len())
            .finish()
    }
}

struct Parsed {
    version: u32,
    alignment: u64,
    data_offset: u64,
    metadata: Vec<(String, MetaValue)>,
    meta_index: HashMap<String, usize>,
    tensors: Vec<TensorInfo>,
    tensor_index: HashMap<String, usize>,
}

impl GgufFile {
    /// Memory-map and parse a GGUF file. The mapping is read-only; the file must not be modified
    /// while it is open.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, GgufError> {
        let path = path.as_ref();
        let io = |source| GgufError::Io { path: path.display().to_string(), source };
        let file = File::open(path).map_err(io)?;
        let meta = file.metadata().map_err(io)?;
        if !meta.is_file() {
            return Err(GgufError::Invalid(format!("{} is not a regular file", path.display())));
        }
        if meta.len() == 0 {
            return Err(GgufError::Invalid(format!("{} is empty", path.display())));
        }
        // SAFETY: the map is read-only and private to this process; the file is documented as not to be
        // modified while open (the same contract as every mmap-based model loader).
        let mmap = unsafe { memmap2::MmapOptions::new().map(&file) }.map_err(io)?;
        Self::from_backing(Backing::Mmap(mmap))
    }

    /// Parse owned bytes with the same code as `open` (tests, fuzzing).
    pub fn from_bytes(bytes: Vec<u8>) -> Result<Self, GgufError> {
        Self::from_backing(Backing::Owned(bytes))
    }

    fn from_backing(backing: Backing) -> Result<Self, GgufError> {
        let p = parse(backing.bytes())?;
        Ok(GgufFile {
            backing,
            version: p.version,
            alignment: p.alignment,
            data_offset: p.data_offset,
            metadata: p.metadata,
            meta_index: p.meta_index,
            tensors: p.tensors,
            tensor_index: p.tensor_index,
        })
    }

    pub fn version(&self) -> u32 { self.version }
    pub fn alignment(&self) -> u64 { self.alignment }
    /// Absolute file offset of the data section.
    pub fn data_offset(&self) -> u64 { self.data_offset }
    /// Metadata in file order.
    pub fn metadata(&self) -> &[(String, MetaValue)] { &self.metadata }
    pub fn get(&self, key: &str) -> Option<&MetaValue> {
        self.meta_index.get(key).map(|&i| &self.metadata[i].1)
    }
    /// Tensor directory in file order.
    pub fn tensors(&self) -> &[TensorInfo] { &self.tensors }
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensor_index.get(name).map(|&i| &self.tensors[i])
    }
    /// Bytes of a tensor of this file (zero-copy). Every span was checked at parse time; a `TensorInfo`
    /// that does not describe bytes inside this file (e.g. one from another file) gives an empty slice.
    pub fn tensor_data(&self, t: &TensorInfo) -> &[u8] {
        let bytes = self.bytes();
        let start = self.data_offset.checked_add(t.offset);
        let end = start.and_then(|s| s.checked_add(t.n_bytes));
        match (start, end) {
            (Some(s), Some(e)) if e <= bytes.len() as u64 => &bytes[s as usize..e as usize],
            _ => &[],
        }
    }
    /// Absolute byte range of a tensor's data in the file (for map plans that map only some tensors).
    pub fn tensor_file_range(&self, t: &TensorInfo) -> std::ops::Range<u64> {
        let start = self.data_offset.saturating_add(t.offset);
        start..start.saturating_add(t.n_bytes)
    }
    /// Bytes of the named tensor, or an error naming it when absent.
    pub fn tensor_bytes(&self, name: &str) -> Result<&[u8], GgufError> {
        let t = self.tensor(name).ok_or_else(|| GgufError::Tensor {
            name: name.to_string(),
            problem: "not present in the file".to_string(),
        })?;
        Ok(self.tensor_data(t))
    }
    /// Whole file bytes.
    pub fn bytes(&self) -> &[u8] { self.backing.bytes() }

    /// Whether the bytes are a file mapping (whole pages, alive as long as the file is), rather than
    /// owned bytes: a device may then wrap them without a copy.
    pub fn is_mapped(&self) -> bool { matches!(self.backing, Backing::Mmap(_)) }

    fn require(&self, key: &str) -> Result<&MetaValue, GgufError> {
        self.get(key).ok_or_else(|| meta_err(key, "missing"))
    }

    // Typed accessors, widening as the C engine does. Missing key or wrong type -> GgufError::Meta naming the key.

    /// u32 from any integer type whose value fits (u32, i32 ≥ 0, u64 in range, ...).
    pub fn get_u32(&self, key: &str) -> Result<u32, GgufError> {
        let v = self.require(key)?;
        v.as_u32().ok_or_else(|| wrong(key, "u32", v))
    }
    /// u64 from any integer type whose value is non-negative.
    pub fn get_u64(&self, key: &str) -> Result<u64, GgufError> {
        let v = self.require(key)?;
        v.as_u64().ok_or_else(|| wrong(key, "u64", v))
    }
    /// f32 from f32, f64 or any integer type.
    pub fn get_f32(&self, key: &str) -> Result<f32, GgufError> {
        let v = self.require(key)?;
        v.as_f32().ok_or_else(|| wrong(key, "f32", v))
    }
    pub fn get_bool(&self, key: &str) -> Result<bool, GgufError> {
        let v = self.require(key)?;
        v.as_bool().ok_or_else(|| wrong(key, "bool", v))
    }
    pub fn get_str(&self, key: &str) -> Result<&str, GgufError> {
        let v = self.require(key)?;
        v.as_str().ok_or_else(|| wrong(key, "str", v))
    }
    /// Integer array (u32, i32, u64, i64, ...), every element must fit in u32.
    pub fn get_u32_array(&self, key: &str) -> Result<Vec<u32>, GgufError> {
        let (et, items) = self.array(key, "u32 array")?;
        if !et.is_integer() {
            return Err(meta_err(key, format!("expected an integer array, found array<{et}>")));
        }
        items
            .iter()
            .enumerate()
            .map(|(i, v)| {
                v.as_u32().ok_or_else(|| {
                    meta_err(key, format!("element {i} = {v} does not fit in u32"))
                })
            })
            .collect()
    }
    /// Float array from f32, f64 or integer arrays.
    pub fn get_f32_array(&self, key: &str) -> Result<Vec<f32>, GgufError> {
        let (et, items) = self.array(key, "f32 array")?;
        if !(et.is_integer() || matches!(et, MetaType::F32 | MetaType::F64)) {
            return Err(meta_err(key, format!("expected a numeric array, found array<{et}>")));
        }
        items
            .iter()
            .enumerate()
            .map(|(i, v)| v.as_f32().ok_or_else(|| meta_err(key, format!("element {i} is not a number"))))
            .collect()
    }
    pub fn get_str_array(&self, key: &str) -> Result<Vec<&str>, GgufError> {
        let (et, items) = self.array(key, "str array")?;
        if et != MetaType::Str {
            return Err(meta_err(key, format!("expected array<str>, found array<{et}>")));
        }
        items
            .iter()
            .enumerate()
            .map(|(i, v)| v.as_str().ok_or_else(|| meta_err(key, format!("element {i} is not a string"))))
            .collect()
    }

    fn array(&self, key: &str, expected: &str) -> Result<(MetaType, &[MetaValue]), GgufError> {
        match self.require(key)? {
            MetaValue::Array(t, items) => Ok((*t, items)),
            other => Err(wrong(key, expected, other)),
        }
    }
}

fn meta_err(key: &str, problem: impl Into<String>) -> GgufError {
    GgufError::Meta { key: key.to_string(), problem: problem.into() }
}

fn wrong(key: &str, expected: &str, found: &MetaValue) -> GgufError {
    meta_err(
        key,
        format!("expected {expected}, found {} = {}", found.type_name(), found.display_abbrev(4)),
    )
}

fn invalid(msg: impl Into<String>) -> GgufError {
    GgufError::Invalid(msg.into())
}

/// Bounds-checked little-endian cursor over the file bytes.
struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    fn take(&mut self, n: usize, what: &dyn Fn() -> String) -> Result<&'a [u8], GgufError> {
        if n > self.remaining() {
            return Err(invalid(format!(
                "truncated file: {} needs {n} bytes at offset {}, only {} left",
                what(),
                self.pos,
                self.remaining()
            )));
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    fn arr<const N: usize>(&mut self, what: &dyn Fn() -> String) -> Result<[u8; N], GgufError> {
        let s = self.take(N, what)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    fn u32(&mut self, what: &dyn Fn() -> String) -> Result<u32, GgufError> {
        Ok(u32::from_le_bytes(self.arr(what)?))
    }

    fn u64(&mut self, what: &dyn Fn() -> String) -> Result<u64, GgufError> {
        Ok(u64::from_le_bytes(self.arr(what)?))
    }

    /// GGUF string: u64 length + UTF-8 bytes. The length is checked against the bytes left
    /// before anything is allocated.
    fn string(&mut self, what: &dyn Fn() -> String) -> Result<String, GgufError> {
        let at = self.pos;
        let len = self.u64(&|| format!("{} (string length)", what()))?;
        if len > self.remaining() as u64 {
            return Err(invalid(format!(
                "{}: string length {len} at offset {at} exceeds the {} bytes left in the file",
                what(),
                self.remaining()
            )));
        }
        let bytes = self.take(len as usize, what)?;
        match std::str::from_utf8(bytes) {
            Ok(s) => Ok(s.to_string()),
            Err(e) => Err(invalid(format!("{}: string at offset {at} is not valid UTF-8 ({e})", what()))),
        }
    }
}

/// Capacity to reserve up front for `n` items announced by the file: counts were already bounded by
/// the bytes left, and reserving at most 64 Ki keeps a lying count from costing memory before the
/// items are actually read.
fn prealloc(n: u64) -> usize {
    n.min(1 << 16) as usize
}

struct MetaBudget {
    left: u64,
}

fn read_value(
    cur: &mut Cursor<'_>,
    ty: MetaType,
    key: &str,
    depth: usize,
    budget: &mut MetaBudget,
) -> Result<MetaValue, GgufError> {
    if budget.left == 0 {
        return Err(meta_err(
            key,
            format!("too many metadata values in the file (limit {MAX_META_VALUES})"),
        ));
    }
    budget.left -= 1;
    let what = || format!("value of metadata key `{key}`");
    let what: &dyn Fn() -> String = &what;
    Ok(match ty {
        MetaType::U8 => MetaValue::U8(cur.arr::<1>(what)?[0]),
        MetaType::I8 => MetaValue::I8(cur.arr::<1>(what)?[0] as i8),
        MetaType::U16 => MetaValue::U16(u16::from_le_bytes(cur.arr(what)?)),
        MetaType::I16 => MetaValue::I16(i16::from_le_bytes(cur.arr(what)?)),
        MetaType::U32 => MetaValue::U32(u32::from_le_bytes(cur.arr(what)?)),
        MetaType::I32 => MetaValue::I32(i32::from_le_bytes(cur.arr(what)?)),
        MetaType::F32 => MetaValue::F32(f32::from_le_bytes(cur.arr(what)?)),
        MetaType::U64 => MetaValue::U64(u64::from_le_bytes(cur.arr(what)?)),
        MetaType::I64 => MetaValue::I64(i64::from_le_bytes(cur.arr(what)?)),
        MetaType::F64 => MetaValue::F64(f64::from_le_bytes(cur.arr(what)?)),
        MetaType::Bool => {
            let at = cur.pos;
            match cur.arr::<1>(what)?[0] {
                0 => MetaValue::Bool(false),
                1 => MetaValue::Bool(true),
                b => {
                    return Err(meta_err(key, format!("invalid bool byte {b} at offset {at} (must be 0 or 1)")))
                }
            }
        }
        MetaType::Str => MetaValue::Str(cur.string(what)?),
        MetaType::Array => {
            if depth >= MAX_ARRAY_DEPTH {
                return Err(meta_err(key, format!("arrays nested deeper than {MAX_ARRAY_DEPTH} levels")));
            }
            let at = cur.pos;
            let et_raw = cur.u32(&|| format!("array element type of metadata key `{key}`"))?;
            let et = MetaType::from_u32(et_raw).ok_or_else(|| {
                meta_err(key, format!("unknown array element type id {et_raw} at offset {at}"))
            })?;
            let count = cur.u64(&|| format!("array length of metadata key `{key}`"))?;
            let min = et.min_encoded_size() as u64;
            if count > cur.remaining() as u64 / min {
                return Err(meta_err(
                    key,
                    format!(
                        "array<{et}> count {count} at offset {at} cannot fit in the {} bytes left in the file",
                        cur.remaining()
                    ),
                ));
            }
            if count > budget.left {
                return Err(meta_err(
                    key,
                    format!("array count {count} exceeds the metadata value limit {MAX_META_VALUES}"),
                ));
            }
            let mut items = Vec::with_capacity(prealloc(count));
            for _ in 0..count {
                items.push(read_value(cur, et, key, depth + 1, budget)?);
            }
            MetaValue::Array(et, items)
        }
    })
}

fn parse(buf: &[u8]) -> Result<Parsed, GgufError> {
    let mut cur = Cursor { buf, pos: 0 };
    if buf.len() < 4 {
        return Err(invalid(format!("file too short for a GGUF header ({} bytes)", buf.len())));
    }
    let magic = cur.arr::<4>(&|| "magic".into())?;
    if magic != GGUF_MAGIC {
        return Err(invalid(format!(
            "bad magic {:02x?} (expected \"GGUF\"); not a GGUF file",
            magic
        )));
    }
    let version = cur.u32(&|| "header version".into())?;
    if version != GGUF_VERSION {
        if version.swap_bytes() == GGUF_VERSION || version.swap_bytes() == 2 {
            return Err(invalid(format!(
                "big-endian GGUF (version field {version:#x}) is not supported; only little-endian v3"
            )));
        }
        return Err(invalid(format!("unsupported GGUF version {version} (only version 3 is supported)")));
    }
    let n_tensors = cur.u64(&|| "header tensor count".into())?;
    let n_kv = cur.u64(&|| "header metadata count".into())?;

    // A key-value pair takes at least 8 (key len) + 4 (type) + 1 bytes; a tensor info at least
    // 8 (name len) + 4 (n_dims) + 4 (type) + 8 (offset).
    const MIN_KV: u64 = 13;
    const MIN_TI: u64 = 24;
    let rem = cur.remaining() as u64;
    if n_kv > rem / MIN_KV {
        return Err(invalid(format!(
            "metadata count {n_kv} cannot fit in the {rem} bytes after the header (truncated or corrupt file)"
        )));
    }
    if n_tensors > rem / MIN_TI {
        return Err(invalid(format!(
            "tensor count {n_tensors} cannot fit in the {rem} bytes after the header (truncated or corrupt file)"
        )));
    }
    if n_kv.saturating_mul(MIN_KV).saturating_add(n_tensors.saturating_mul(MIN_TI)) > rem {
        return Err(invalid(format!(
            "metadata count {n_kv} and tensor count {n_tensors} cannot fit in the {rem} bytes after the header"
        )));
    }

    let mut budget = MetaBudget { left: MAX_META_VALUES };
    let mut metadata = Vec::with_capacity(prealloc(n_kv));
    let mut meta_index = HashMap::with_capacity(prealloc(n_kv));
    for i in 0..n_kv {
        let key = cur.string(&|| format!("key of metadata entry {i}"))?;
        let at = cur.pos;
        let ty_raw = cur.u32(&|| format!("type of metadata key `{key}`"))?;
        let ty = MetaType::from_u32(ty_raw)
            .ok_or_else(|| meta_err(&key, format!("unknown value type id {ty_raw} at offset {at}")))?;
        let value = read_value(&mut cur, ty, &key, 0, &mut budget)?;
        if meta_index.contains_key(&key) {
            return Err(meta_err(&key, "duplicate metadata key"));
        }
        meta_index.insert(key.clone(), metadata.len());
        metadata.push((key, value));
    }

    const ALIGN_KEY: &str = "general.alignment";
    let alignment = match meta_index.get(ALIGN_KEY) {
        None => DEFAULT_ALIGNMENT,
        Some(&i) => {
            let v = &metadata[i].1;
            let a = v.as_u32().ok_or_else(|| wrong(ALIGN_KEY, "u32", v))? as u64;
            if a == 0 || !a.is_power_of_two() {
                return Err(meta_err(ALIGN_KEY, format!("alignment {a} must be a non-zero power of two")));
            }
            a
        }
    };

    let mut tensors: Vec<TensorInfo> = Vec::with_capacity(prealloc(n_tensors));
    let mut tensor_index = HashMap::with_capacity(prealloc(n_tensors));
    for i in 0..n_tensors {
        let name = cur.string(&|| format!("name of tensor {i}"))?;
        let terr = |problem: String| GgufError::Tensor { name: name.clone(), problem };
        let what = |field: &str| {
            let s = format!("{field} of tensor `{name}`");
            move || s.clone()
        };
        let n_dims = cur.u32(&what("dimension count"))?;
        if n_dims as usize > MAX_DIMS {
            return Err(terr(format!("{n_dims} dimensions (at most {MAX_DIMS})")));
        }
        let mut dims = Vec::with_capacity(n_dims as usize);
        for _ in 0..n_dims {
            dims.push(cur.u64(&what("dimensions"))?);
        }
        let ty_raw = cur.u32(&what("type"))?;
        let ty = GgmlType::from_u32(ty_raw)
            .ok_or_else(|| terr(format!("unknown or unsupported ggml type id {ty_raw}")))?;
        let offset = cur.u64(&what("offset"))?;
        if offset % alignment != 0 {
            return Err(terr(format!("data offset {offset} is not a multiple of the alignment {alignment}")));
        }
        let n_bytes = tensor_n_bytes(ty, &dims).map_err(terr)?;
        if tensor_index.contains_key(&name) {
            return Err(terr("duplicate tensor name".into()));
        }
        tensor_index.insert(name.clone(), tensors.len());
        tensors.push(TensorInfo { name, ty, dims, offset, n_bytes });
    }

    let dir_end = cur.pos as u64;
    let data_offset = align_up(dir_end, alignment)
        .ok_or_else(|| invalid(format!("data offset overflows (alignment {alignment})")))?;
    let file_len = buf.len() as u64;
    let data_len = file_len.saturating_sub(data_offset);
    for t in &tensors {
        let end = t.offset.checked_add(t.n_bytes);
        match end {
            Some(end) if end <= data_len && (t.n_bytes > 0 || t.offset <= data_len) => {}
            _ => {
                return Err(GgufError::Tensor {
                    name: t.name.clone(),
                    problem: format!(
                        "data [{}, +{}) relative to data section at {data_offset} lies outside the file \
                         ({file_len} bytes, data section {data_len} bytes)",
                        t.offset, t.n_bytes
                    ),
                })
            }
        }
    }
    // Overlap check over non-empty spans, sorted by offset.
    let mut order: Vec<usize> = (0..tensors.len()).filter(|&i| tensors[i].n_bytes > 0).collect();
    order.sort_by_key(|&i| tensors[i].offset);
    for w in order.windows(2) {
        let (a, b) = (&tensors[w[0]], &tensors[w[1]]);
        if a.offset + a.n_bytes > b.offset {
            return Err(GgufError::Tensor {
                name: b.name.clone(),
                problem: format!(
                    "data [{}, {}) overlaps tensor `{}` [{}, {})",
                    b.offset,
                    b.offset + b.n_bytes,
                    a.name,
                    a.offset,
                    a.offset + a.n_bytes
                ),
            });
        }
    }

    Ok(Parsed { version, alignment, data_offset, metadata, meta_index, tensors, tensor_index })
}
