//! Hostile files: a corpus of targeted mutations of one valid file (each must give the right error),
//! plus property tests over random mutations and truncations (the parser must never panic).
use ds4_gguf::{GgufError, GgufFile};
use proptest::prelude::*;
use std::collections::BTreeMap;

/// Hand-encoded valid GGUF file that remembers the offsets of interesting fields.
struct Built {
    bytes: Vec<u8>,
    marks: BTreeMap<&'static str, usize>,
}

struct B {
    buf: Vec<u8>,
    marks: BTreeMap<&'static str, usize>,
}

impl B {
    fn mark(&mut self, m: &'static str) {
        self.marks.insert(m, self.buf.len());
    }
    fn u32(&mut self, v: u32) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }
    fn u64(&mut self, v: u64) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }
    fn s(&mut self, s: &str) {
        self.u64(s.len() as u64);
        self.buf.extend_from_slice(s.as_bytes());
    }
}

const T_STR: u32 = 8;
const T_U32: u32 = 4;
const T_ARR: u32 = 9;
const T_BOOL: u32 = 7;
const T_I32: u32 = 5;

fn valid() -> Built {
    let mut b = B { buf: Vec::new(), marks: BTreeMap::new() };
    b.mark("magic");
    b.buf.extend_from_slice(b"GGUF");
    b.mark("version");
    b.u32(3);
    b.mark("n_tensors");
    b.u64(3);
    b.mark("n_kv");
    b.u64(6);
    // kv 0: string
    b.mark("kv0");
    b.s("general.architecture");
    b.u32(T_STR);
    b.mark("str_len");
    b.s("deepseek4");
    // kv 1: alignment
    b.mark("kv1");
    b.s("general.alignment");
    b.mark("align_type");
    b.u32(T_U32);
    b.mark("align_val");
    b.u32(32);
    // kv 2: u32 array
    b.mark("kv2");
    b.s("k.aaaa");
    b.u32(T_ARR);
    b.mark("arr_type");
    b.u32(T_U32);
    b.mark("arr_count");
    b.u64(3);
    for v in [4u32, 128, 0] {
        b.u32(v);
    }
    // kv 3: nested array [[1, 2], ["x"]]
    b.mark("kv3");
    b.s("k.bbbb");
    b.u32(T_ARR);
    b.u32(T_ARR);
    b.mark("nested_count");
    b.u64(2);
    b.u32(T_I32);
    b.mark("inner_count");
    b.u64(2);
    b.u32(1);
    b.u32(2);
    b.u32(T_STR);
    b.u64(1);
    b.mark("inner_str");
    b.s("x");
    // kv 4: bool
    b.mark("kv4");
    b.s("k.cccc");
    b.mark("bool_type");
    b.u32(T_BOOL);
    b.mark("bool_val");
    b.buf.push(1);
    // kv 5: string array
    b.mark("kv5");
    b.s("k.dddd");
    b.u32(T_ARR);
    b.u32(T_STR);
    b.u64(2);
    b.s("ab");
    b.mark("str_arr_1");
    b.s("cd");
    // tensor 0: F32 [8] @0 (32 bytes)
    b.mark("ti0");
    b.s("t0");
    b.mark("t0_ndims");
    b.u32(1);
    b.mark("t0_dim0");
    b.u64(8);
    b.u32(0);
    b.mark("t0_offset");
    b.u64(0);
    // tensor 1: Q8_0 [64, 2] @32 (136 bytes)
    b.mark("ti1");
    b.mark("t1_name");
    b.s("t1");
    b.u32(2);
    b.mark("t1_dim0");
    b.u64(64);
    b.mark("t1_dim1");
    b.u64(2);
    b.mark("t1_type");
    b.u32(8);
    b.mark("t1_offset");
    b.u64(32);
    // tensor 2: F16 [4, 4] @192 (32 bytes)
    b.mark("ti2");
    b.s("t2");
    b.u32(2);
    b.mark("t2_dim0");
    b.u64(4);
    b.mark("t2_dim1");
    b.u64(4);
    b.u32(1);
    b.mark("t2_offset");
    b.u64(192);
    b.mark("dir_end");
    while b.buf.len() % 32 != 0 {
        b.buf.push(0);
    }
    b.mark("data");
    let data_start = b.buf.len();
    b.buf.resize(data_start + 224, 0);
    for (i, x) in b.buf[data_start..].iter_mut().enumerate() {
        *x = i as u8;
    }
    b.mark("end");
    Built { bytes: b.buf, marks: b.marks }
}

impl Built {
    fn at(&self, m: &str) -> usize {
        self.marks[m]
    }
    fn set_u32(&mut self, m: &str, v: u32) {
        let o = self.at(m);
        self.bytes[o..o + 4].copy_from_slice(&v.to_le_bytes());
    }
    fn set_u64(&mut self, m: &str, v: u64) {
        let o = self.at(m);
        self.bytes[o..o + 8].copy_from_slice(&v.to_le_bytes());
    }
    fn parse(&self) -> Result<GgufFile, GgufError> {
        GgufFile::from_bytes(self.bytes.clone())
    }
}

fn mutated(f: impl FnOnce(&mut Built)) -> GgufError {
    let mut b = valid();
    f(&mut b);
    match b.parse() {
        Ok(_) => panic!("mutated file was accepted"),
        Err(e) => e,
    }
}

fn invalid_containing(e: &GgufError, needles: &[&str]) {
    let msg = e.to_string();
    assert!(matches!(e, GgufError::Invalid(_)), "expected Invalid, got {e:?}");
    for n in needles {
        assert!(msg.contains(n), "`{msg}` should contain `{n}`");
    }
}

fn meta_err(e: &GgufError, k: &str, needle: &str) {
    match e {
        GgufError::Meta { key, problem } => {
            assert_eq!(key, k, "{e}");
            assert!(problem.contains(needle), "`{problem}` should contain `{needle}`");
        }
        other => panic!("expected Meta error for {k}, got {other:?}"),
    }
}

fn tensor_err(e: &GgufError, n: &str, needle: &str) {
    match e {
        GgufError::Tensor { name, problem } => {
            assert_eq!(name, n, "{e}");
            assert!(problem.contains(needle), "`{problem}` should contain `{needle}`");
        }
        other => panic!("expected Tensor error for {n}, got {other:?}"),
    }
}

#[test]
fn valid_file_parses() {
    let b = valid();
    let f = b.parse().unwrap();
    assert_eq!(f.data_offset() as usize, b.at("data"));
    assert_eq!(f.tensors().len(), 3);
    assert_eq!(f.tensor("t1").unwrap().n_bytes, 136);
    assert_eq!(f.tensor_data(f.tensor("t2").unwrap())[0], 192);
    assert_eq!(f.get_u32_array("k.aaaa").unwrap(), vec![4, 128, 0]);
    assert_eq!(f.get_str_array("k.dddd").unwrap(), vec!["ab", "cd"]);
    assert!(f.get_bool("k.cccc").unwrap());
}

#[test]
fn truncation_at_every_boundary_and_more() {
    let b = valid();
    let end = b.at("end");
    let mut points: Vec<usize> = b.marks.values().copied().filter(|&p| p < end).collect();
    for p in b.marks.values() {
        points.extend([p + 1, p + 3, p.saturating_sub(1)]);
    }
    // Every byte of the header and directory, and a few in the data.
    points.extend(0..b.at("data"));
    points.extend([b.at("data") + 1, b.at("data") + 31, b.at("data") + 100, end - 1]);
    points.sort();
    points.dedup();
    for p in points.into_iter().filter(|&p| p < end) {
        let e = GgufFile::from_bytes(b.bytes[..p].to_vec()).err().unwrap_or_else(|| panic!("truncated at {p} accepted"));
        let msg = e.to_string();
        assert!(
            msg.contains("truncated")
                || msg.contains("outside the file")
                || msg.contains("too short")
                || msg.contains("cannot fit")
                || msg.contains("exceeds the"),
            "truncation at {p}: unexpected error `{msg}`"
        );
    }
}

#[test]
fn bad_magic_and_version() {
    let e = mutated(|b| b.bytes[0] = b'X');
    invalid_containing(&e, &["bad magic", "not a GGUF"]);
    for v in [0u32, 1, 2, 4, u32::MAX] {
        let e = mutated(|b| b.set_u32("version", v));
        invalid_containing(&e, &["unsupported GGUF version", &v.to_string()]);
    }
    let e = mutated(|b| b.set_u32("version", 3u32.swap_bytes()));
    invalid_containing(&e, &["big-endian"]);
    let e = GgufFile::from_bytes(vec![]).unwrap_err();
    invalid_containing(&e, &["too short"]);
}

#[test]
fn absurd_counts_and_lengths() {
    for v in [u64::MAX, 1 << 40, 1000] {
        let e = mutated(|b| b.set_u64("str_len", v));
        invalid_containing(&e, &["general.architecture", "string length", &v.to_string()]);
    }
    for v in [u64::MAX, 1 << 62, 1 << 30, 100_000] {
        let e = mutated(|b| b.set_u64("arr_count", v));
        meta_err(&e, "k.aaaa", "cannot fit");
        let e = mutated(|b| b.set_u64("nested_count", v));
        meta_err(&e, "k.bbbb", "cannot fit");
    }
    for v in [u64::MAX, 1 << 40, 10_000] {
        let e = mutated(|b| b.set_u64("n_tensors", v));
        invalid_containing(&e, &["tensor count", &v.to_string()]);
        let e = mutated(|b| b.set_u64("n_kv", v));
        invalid_containing(&e, &["metadata count", &v.to_string()]);
    }
    // A count that fits the bytes left but runs into the next fields: clean error, not a panic.
    let e = mutated(|b| b.set_u64("arr_count", 50));
    assert!(matches!(e, GgufError::Meta { .. } | GgufError::Invalid(_)), "{e:?}");
}

#[test]
fn bad_metadata_values() {
    let e = mutated(|b| b.set_u32("arr_type", 13));
    meta_err(&e, "k.aaaa", "unknown array element type id 13");
    let e = mutated(|b| b.set_u32("bool_type", 99));
    meta_err(&e, "k.cccc", "unknown value type id 99");
    let e = mutated(|b| {
        let o = b.at("bool_val");
        b.bytes[o] = 2;
    });
    meta_err(&e, "k.cccc", "invalid bool byte 2");
    let e = mutated(|b| {
        let o = b.at("inner_str") + 8;
        b.bytes[o] = 0xff;
    });
    invalid_containing(&e, &["k.bbbb", "UTF-8"]);
    // Duplicate key: rename k.bbbb to k.aaaa.
    let e = mutated(|b| {
        let o = b.at("kv3") + 8;
        b.bytes[o..o + 6].copy_from_slice(b"k.aaaa");
    });
    meta_err(&e, "k.aaaa", "duplicate");
}

#[test]
fn bad_alignment() {
    for a in [0u32, 3, 48, 100] {
        let e = mutated(|b| b.set_u32("align_val", a));
        meta_err(&e, "general.alignment", "power of two");
    }
}

#[test]
fn alignment_widening_and_effect() {
    let mut b = valid();
    b.set_u32("align_type", T_I32);
    assert_eq!(b.parse().unwrap().alignment(), 32);
    // Alignment 64: the data section moves to the next multiple of 64 and offsets must follow.
    let mut b = valid();
    b.set_u32("align_val", 64);
    let e = b.parse().unwrap_err();
    tensor_err(&e, "t1", "not a multiple of the alignment 64");
    // Alignment as a string.
    let mut b = valid();
    b.set_u32("align_type", T_STR);
    assert!(b.parse().is_err());
}

#[test]
fn bad_tensor_entries() {
    let e = mutated(|b| b.set_u32("t1_type", 99));
    tensor_err(&e, "t1", "unknown or unsupported ggml type id 99");
    let e = mutated(|b| b.set_u32("t1_type", 2)); // Q4_0: not supported by DS4
    tensor_err(&e, "t1", "type id 2");
    let e = mutated(|b| b.set_u64("t1_offset", 33));
    tensor_err(&e, "t1", "not a multiple of the alignment 32");
    let e = mutated(|b| b.set_u64("t1_dim0", 33));
    tensor_err(&e, "t1", "not a multiple of the Q8_0 block size 32");
    let e = mutated(|b| {
        b.set_u64("t2_dim0", 1 << 32);
        b.set_u64("t2_dim1", 1 << 32);
    });
    tensor_err(&e, "t2", "overflows");
    let e = mutated(|b| b.set_u64("t0_dim0", u64::MAX));
    tensor_err(&e, "t0", "out of range");
    let e = mutated(|b| b.set_u32("t0_ndims", 5));
    tensor_err(&e, "t0", "5 dimensions");
    let e = mutated(|b| b.set_u32("t0_ndims", u32::MAX));
    tensor_err(&e, "t0", "dimensions");
    // Overlap: t2 moved into t1's span [32, 168).
    let e = mutated(|b| b.set_u64("t2_offset", 160));
    tensor_err(&e, "t2", "overlaps tensor `t1`");
    let e = mutated(|b| b.set_u64("t0_offset", 32));
    assert!(e.to_string().contains("overlaps"), "{e}");
    // Out of file.
    for off in [224u64, 1 << 40, u64::MAX - 31] {
        let e = mutated(|b| b.set_u64("t2_offset", off));
        tensor_err(&e, "t2", "outside the file");
    }
    let e = mutated(|b| b.set_u64("t2_dim1", 5));
    tensor_err(&e, "t2", "outside the file");
    // Duplicate tensor name: rename t1 to t0.
    let e = mutated(|b| {
        let o = b.at("t1_name") + 8;
        b.bytes[o..o + 2].copy_from_slice(b"t0");
    });
    tensor_err(&e, "t0", "duplicate tensor name");
}

#[test]
fn nesting_depth_limit() {
    // depth-(MAX+1) nested array: [[[[...[u8]...]]]]
    let mut buf = Vec::new();
    buf.extend_from_slice(b"GGUF");
    buf.extend_from_slice(&3u32.to_le_bytes());
    buf.extend_from_slice(&0u64.to_le_bytes());
    buf.extend_from_slice(&1u64.to_le_bytes());
    buf.extend_from_slice(&4u64.to_le_bytes());
    buf.extend_from_slice(b"deep");
    buf.extend_from_slice(&T_ARR.to_le_bytes());
    let depth = ds4_gguf::MAX_ARRAY_DEPTH + 1;
    for _ in 0..depth - 1 {
        buf.extend_from_slice(&T_ARR.to_le_bytes());
        buf.extend_from_slice(&1u64.to_le_bytes());
    }
    buf.extend_from_slice(&0u32.to_le_bytes());
    buf.extend_from_slice(&1u64.to_le_bytes());
    buf.push(7);
    buf.resize(buf.len() + 64, 0);
    let e = GgufFile::from_bytes(buf).unwrap_err();
    meta_err(&e, "deep", "nested deeper");
}

#[test]
fn fixture_tensor_data_outside_file_after_truncating_data() {
    let bytes = std::fs::read(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/gguf_py.gguf")).unwrap();
    let f = GgufFile::from_bytes(bytes.clone()).unwrap();
    let last = f.tensors().iter().max_by_key(|t| t.offset + t.n_bytes).unwrap().clone();
    let end = (f.data_offset() + last.offset + last.n_bytes) as usize;
    assert!(GgufFile::from_bytes(bytes[..end].to_vec()).is_ok());
    let e = GgufFile::from_bytes(bytes[..end - 1].to_vec()).unwrap_err();
    tensor_err(&e, &last.name, "outside the file");
}

/// Parse, and when accepted exercise everything a loader would touch.
fn exercise(bytes: Vec<u8>) {
    if let Ok(f) = GgufFile::from_bytes(bytes) {
        for t in f.tensors() {
            assert_eq!(f.tensor_data(t).len() as u64, t.n_bytes);
        }
        for (k, v) in f.metadata() {
            let _ = (f.get_u32(k), f.get_u64(k), f.get_f32(k), f.get_bool(k), f.get_str(k));
            let _ = (f.get_u32_array(k), f.get_f32_array(k), f.get_str_array(k));
            let _ = v.display_abbrev(3).to_string();
        }
    }
}

fn seeds() -> Vec<Vec<u8>> {
    vec![
        valid().bytes,
        std::fs::read(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/gguf_py.gguf")).unwrap(),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 3000, ..ProptestConfig::default() })]

    #[test]
    fn random_byte_mutations_never_panic(
        which in 0usize..2,
        edits in proptest::collection::vec((any::<u32>(), any::<u8>()), 1..8),
        trunc in proptest::option::of(any::<u32>()),
    ) {
        let mut bytes = seeds().swap_remove(which);
        for (pos, val) in edits {
            let n = bytes.len();
            bytes[pos as usize % n] = val;
        }
        if let Some(t) = trunc {
            let n = bytes.len();
            bytes.truncate(t as usize % (n + 1));
        }
        exercise(bytes);
    }

    #[test]
    fn random_word_mutations_never_panic(
        which in 0usize..2,
        pos in any::<u32>(),
        word in prop_oneof![any::<u64>(), Just(u64::MAX), Just(0u64), Just(1u64 << 63), 0u64..64],
    ) {
        let mut bytes = seeds().swap_remove(which);
        let n = bytes.len();
        let p = pos as usize % (n - 8);
        bytes[p..p + 8].copy_from_slice(&word.to_le_bytes());
        exercise(bytes);
    }

    #[test]
    fn random_bytes_never_panic(mut bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        if bytes.len() >= 8 {
            bytes[..4].copy_from_slice(b"GGUF");
            bytes[4..8].copy_from_slice(&3u32.to_le_bytes());
        }
        exercise(bytes);
    }
}
