//! Writer -> reader round trip, typed accessors and widening.
use ds4_gguf::{GgmlType, GgufError, GgufFile, GgufWriter, MetaType, MetaValue};

fn all_types_kv() -> Vec<(&'static str, MetaValue)> {
    vec![
        ("general.architecture", MetaValue::Str("deepseek4".into())),
        ("t.u8", MetaValue::U8(200)),
        ("t.i8", MetaValue::I8(-100)),
        ("t.u16", MetaValue::U16(60000)),
        ("t.i16", MetaValue::I16(-30000)),
        ("t.u32", MetaValue::U32(4_000_000_000)),
        ("t.i32", MetaValue::I32(-2_000_000_000)),
        ("t.f32", MetaValue::F32(1.5)),
        ("t.bool", MetaValue::Bool(true)),
        ("t.str", MetaValue::Str("héllo \"world\"\n".into())),
        ("t.u64", MetaValue::U64(u64::MAX)),
        ("t.i64", MetaValue::I64(i64::MIN)),
        ("t.f64", MetaValue::F64(1e-6)),
        ("t.empty_str", MetaValue::Str(String::new())),
        ("t.arr_u32", MetaValue::Array(MetaType::U32, vec![MetaValue::U32(0), MetaValue::U32(4), MetaValue::U32(128)])),
        ("t.arr_i32", MetaValue::Array(MetaType::I32, vec![MetaValue::I32(0), MetaValue::I32(4)])),
        ("t.arr_i32_neg", MetaValue::Array(MetaType::I32, vec![MetaValue::I32(-1)])),
        ("t.arr_u64", MetaValue::Array(MetaType::U64, vec![MetaValue::U64(7), MetaValue::U64(1 << 33)])),
        ("t.arr_i64", MetaValue::Array(MetaType::I64, vec![MetaValue::I64(7)])),
        ("t.arr_f64", MetaValue::Array(MetaType::F64, vec![MetaValue::F64(10.0), MetaValue::F64(0.25)])),
        ("t.arr_f32", MetaValue::Array(MetaType::F32, vec![MetaValue::F32(10.0)])),
        ("t.arr_str", MetaValue::Array(MetaType::Str, vec![MetaValue::Str("a b".into()), MetaValue::Str("".into())])),
        ("t.arr_empty", MetaValue::Array(MetaType::U32, vec![])),
        ("t.arr_bool", MetaValue::Array(MetaType::Bool, vec![MetaValue::Bool(false), MetaValue::Bool(true)])),
        (
            "t.nested",
            MetaValue::Array(
                MetaType::Array,
                vec![
                    MetaValue::Array(MetaType::I32, vec![MetaValue::I32(1), MetaValue::I32(2)]),
                    MetaValue::Array(MetaType::Str, vec![MetaValue::Str("x".into())]),
                    MetaValue::Array(MetaType::Array, vec![MetaValue::Array(MetaType::U8, vec![MetaValue::U8(9)])]),
                    MetaValue::Array(MetaType::F32, vec![]),
                ],
            ),
        ),
    ]
}

fn tensors() -> Vec<(&'static str, GgmlType, Vec<u64>)> {
    vec![
        ("a.f32", GgmlType::F32, vec![5]),
        ("b.f16", GgmlType::F16, vec![3, 7]),
        ("c.q8_0", GgmlType::Q8_0, vec![64, 3]),
        ("d.empty", GgmlType::F32, vec![0, 4]),
        ("e.q4_k", GgmlType::Q4_K, vec![256, 2, 2]),
        ("f.i32", GgmlType::I32, vec![6, 1, 1, 2]),
        ("g.scalar", GgmlType::F32, vec![]),
    ]
}

fn pattern(seed: usize, n: u64) -> Vec<u8> {
    (0..n).map(|i| (i as usize * 31 + seed * 7 + 1) as u8).collect()
}

fn build_writer(align: Option<u64>) -> GgufWriter {
    let mut w = GgufWriter::new();
    if let Some(a) = align {
        w.set_alignment(a);
    }
    for (k, v) in all_types_kv() {
        w.add_kv(k, v);
    }
    for (n, t, d) in tensors() {
        w.add_tensor_info(n, t, &d).unwrap();
    }
    w
}

fn tmpdir() -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("ds4-gguf-test-{}-{:?}", std::process::id(), std::thread::current().id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn check_file(f: &GgufFile, align: u64) {
    assert_eq!(f.version(), 3);
    assert_eq!(f.alignment(), align);
    assert_eq!(f.data_offset() % align, 0);
    let kv = all_types_kv();
    let md: Vec<_> = f.metadata().iter().filter(|(k, _)| k != "general.alignment").collect();
    assert_eq!(md.len(), kv.len());
    for ((k, v), (ek, ev)) in md.iter().zip(kv.iter()) {
        assert_eq!(k, ek);
        assert_eq!(v, ev, "{k}");
    }
    let ts = tensors();
    assert_eq!(f.tensors().len(), ts.len());
    for (i, (t, (n, ty, d))) in f.tensors().iter().zip(ts.iter()).enumerate() {
        assert_eq!(&t.name, n);
        assert_eq!(t.ty, *ty);
        assert_eq!(&t.dims, d);
        assert_eq!(t.offset % align, 0);
        assert_eq!(f.tensor_data(t), &pattern(i, t.n_bytes)[..], "{n}");
        assert_eq!(f.tensor(n).unwrap(), t);
    }
    assert_eq!(f.tensor("c.q8_0").unwrap().n_bytes, 3 * 2 * 34);
    assert_eq!(f.tensor("e.q4_k").unwrap().n_bytes, 4 * 144);
    assert_eq!(f.tensor("g.scalar").unwrap().n_bytes, 4);
    assert!(f.tensor("nope").is_none());
}

#[test]
fn streaming_roundtrip_chunks_and_alignments() {
    let dir = tmpdir();
    for align in [None, Some(32), Some(64), Some(1), Some(4096)] {
        let path = dir.join(format!("rt-{align:?}.gguf"));
        let mut s = build_writer(align).begin(&path).unwrap();
        assert!(!path.exists(), "file appears only on finish");
        let mut all = Vec::new();
        for (i, (_, ty, d)) in tensors().iter().enumerate() {
            let n = ds4_gguf::tensor_n_bytes(*ty, d).unwrap();
            all.extend(pattern(i, n));
        }
        // Odd chunk sizes crossing tensor boundaries.
        for chunk in all.chunks(13) {
            s.write(chunk).unwrap();
        }
        s.finish().unwrap();
        let f = GgufFile::open(&path).unwrap();
        let a = align.unwrap_or(32);
        check_file(&f, a);
        assert_eq!(f.bytes().len() as u64 % a, 0, "file end padded");
        // In-memory encoder gives identical bytes.
        let datas: Vec<Vec<u8>> = f.tensors().iter().enumerate().map(|(i, t)| pattern(i, t.n_bytes)).collect();
        let refs: Vec<&[u8]> = datas.iter().map(|d| &d[..]).collect();
        let mem = build_writer(align).to_bytes(&refs).unwrap();
        assert_eq!(mem, f.bytes());
        let g = GgufFile::from_bytes(mem).unwrap();
        check_file(&g, a);
        if let Some(a) = align.filter(|a| *a != 32) {
            assert_eq!(f.get_u32("general.alignment").unwrap() as u64, a);
        }
    }
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn per_tensor_writes() {
    let dir = tmpdir();
    let path = dir.join("pt.gguf");
    let mut s = build_writer(None).begin(&path).unwrap();
    for (i, (n, ty, d)) in tensors().iter().enumerate() {
        assert_eq!(s.current_tensor(), if ds4_gguf::tensor_n_bytes(*ty, d).unwrap() == 0 { s.current_tensor() } else { Some(*n) });
        s.write(&pattern(i, ds4_gguf::tensor_n_bytes(*ty, d).unwrap())).unwrap();
    }
    assert_eq!(s.current_tensor(), None);
    assert!(s.write(&[1]).is_err(), "extra bytes rejected");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn stream_errors() {
    let dir = tmpdir();
    let path = dir.join("inc.gguf");
    let mut s = build_writer(None).begin(&path).unwrap();
    s.write(&[0u8; 10]).unwrap();
    let e = s.finish().unwrap_err();
    assert!(matches!(&e, GgufError::Tensor { name, problem } if name == "a.f32" && problem.contains("10 of 20")), "{e}");
    assert!(!path.exists());
    let mut tmp = path.clone().into_os_string();
    tmp.push(".tmp");
    assert!(!std::path::Path::new(&tmp).exists(), "temp removed");

    // Deferred writer errors.
    let mut w = GgufWriter::new();
    w.add_kv("k", MetaValue::U8(1));
    w.add_kv("k", MetaValue::U8(2));
    let e = w.begin(dir.join("dup.gguf")).err().unwrap();
    assert!(matches!(&e, GgufError::Meta { key, .. } if key == "k"), "{e}");
    let mut w = GgufWriter::new();
    w.add_kv("bad", MetaValue::Array(MetaType::U32, vec![MetaValue::I32(1)]));
    assert!(w.to_bytes(&[]).is_err());
    let mut w = GgufWriter::new();
    w.set_alignment(3);
    assert!(w.to_bytes(&[]).is_err());
    let mut w = GgufWriter::new();
    assert!(w.add_tensor_info("q", GgmlType::Q8_0, &[33]).is_err());
    assert!(w.add_tensor_info("q", GgmlType::F32, &[1, 1, 1, 1, 1]).is_err());
    w.add_tensor_info("q", GgmlType::F32, &[1]).unwrap();
    assert!(w.add_tensor_info("q", GgmlType::F32, &[1]).is_err());
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn typed_accessors_widen() {
    let mut w = GgufWriter::new();
    for (k, v) in all_types_kv() {
        w.add_kv(k, v);
    }
    let f = GgufFile::from_bytes(w.to_bytes(&[]).unwrap()).unwrap();
    assert_eq!(f.get_u32("t.u8").unwrap(), 200);
    assert_eq!(f.get_u32("t.u32").unwrap(), 4_000_000_000);
    assert!(f.get_u32("t.i32").is_err());
    assert!(f.get_u32("t.u64").is_err());
    assert_eq!(f.get_u64("t.u64").unwrap(), u64::MAX);
    assert!(f.get_u64("t.i64").is_err());
    assert_eq!(f.get_f32("t.f32").unwrap(), 1.5);
    assert_eq!(f.get_f32("t.f64").unwrap(), 1e-6f32);
    assert_eq!(f.get_f32("t.u32").unwrap(), 4e9);
    assert_eq!(f.get_f32("t.i32").unwrap(), -2e9);
    assert!(f.get_f32("t.str").is_err());
    assert!(f.get_bool("t.bool").unwrap());
    assert!(f.get_bool("t.u8").is_err());
    assert_eq!(f.get_str("general.architecture").unwrap(), "deepseek4");
    assert_eq!(f.get_u32_array("t.arr_u32").unwrap(), vec![0, 4, 128]);
    assert_eq!(f.get_u32_array("t.arr_i32").unwrap(), vec![0, 4]);
    assert_eq!(f.get_u32_array("t.arr_i64").unwrap(), vec![7]);
    assert!(f.get_u32_array("t.arr_u64").is_err());
    assert!(f.get_u32_array("t.arr_i32_neg").is_err());
    assert!(f.get_u32_array("t.arr_f32").is_err());
    assert_eq!(f.get_u32_array("t.arr_empty").unwrap(), Vec::<u32>::new());
    assert_eq!(f.get_f32_array("t.arr_f64").unwrap(), vec![10.0, 0.25]);
    assert_eq!(f.get_f32_array("t.arr_f32").unwrap(), vec![10.0]);
    assert_eq!(f.get_f32_array("t.arr_u32").unwrap(), vec![0.0, 4.0, 128.0]);
    assert!(f.get_f32_array("t.arr_str").is_err());
    assert_eq!(f.get_str_array("t.arr_str").unwrap(), vec!["a b", ""]);
    assert!(f.get_str_array("t.arr_u32").is_err());
    let e = f.get_u32("missing.key").unwrap_err();
    assert!(matches!(&e, GgufError::Meta { key, problem } if key == "missing.key" && problem.contains("missing")));
    let e = f.get_u32("t.str").unwrap_err();
    let msg = e.to_string();
    assert!(msg.contains("t.str") && msg.contains("expected u32") && msg.contains("str"), "{msg}");
    let e = f.get_u32_array("t.arr_i32_neg").unwrap_err().to_string();
    assert!(e.contains("element 0") && e.contains("t.arr_i32_neg"), "{e}");
}

#[test]
fn display_abbrev() {
    let v = MetaValue::Array(MetaType::U32, (0..100).map(MetaValue::U32).collect());
    assert_eq!(v.display_abbrev(3).to_string(), "[0, 1, 2, ... (97 more)]");
    assert_eq!(v.type_name(), "array<u32>");
    assert_eq!(MetaValue::Str("a\"b".into()).to_string(), "\"a\\\"b\"");
}

#[test]
fn alignment_from_kv_and_open_errors() {
    let mut w = GgufWriter::new();
    w.add_kv("general.alignment", MetaValue::U32(256));
    w.add_tensor_info("a", GgmlType::F32, &[3]).unwrap();
    w.add_tensor_info("b", GgmlType::F32, &[3]).unwrap();
    let f = GgufFile::from_bytes(w.to_bytes(&[&[1; 12], &[2; 12]]).unwrap()).unwrap();
    assert_eq!(f.alignment(), 256);
    assert_eq!(f.data_offset(), 256);
    assert_eq!(f.tensor("b").unwrap().offset, 256);
    assert_eq!(f.tensor_file_range(f.tensor("b").unwrap()), 512..524);
    assert_eq!(f.tensor_bytes("b").unwrap(), &[2; 12]);
    assert!(matches!(f.tensor_bytes("zz"), Err(GgufError::Tensor { .. })));

    let dir = tmpdir();
    let empty = dir.join("empty.gguf");
    std::fs::write(&empty, b"").unwrap();
    assert!(GgufFile::open(&empty).unwrap_err().to_string().contains("empty"));
    assert!(GgufFile::open(&dir).is_err());
    assert!(matches!(GgufFile::open(dir.join("missing.gguf")), Err(GgufError::Io { .. })));
    std::fs::remove_dir_all(&dir).ok();
}

/// The finished file is renamed over the output path: a directory, FIFO or device there (e.g.
/// `ds4-gguf synth tiny /dev/null`, which as root replaced /dev/null with a regular file) is refused
/// before anything is written, and left as it was.
#[test]
fn output_path_that_is_not_a_regular_file_is_refused_up_front() {
    use std::os::unix::fs::FileTypeExt;
    let dir = tmpdir();
    let sub = dir.join("a-directory.gguf");
    std::fs::create_dir_all(&sub).unwrap();
    let e = build_writer(None).begin(&sub).err().expect("a directory refused at begin");
    assert!(e.to_string().contains("not a regular file"), "{e}");
    assert!(sub.is_dir());
    let fifo = dir.join("fifo.gguf");
    let made = std::process::Command::new("mkfifo").arg(&fifo).status().is_ok_and(|s| s.success());
    if made {
        let e = build_writer(None).begin(&fifo).err().expect("a FIFO refused at begin");
        assert!(e.to_string().contains("not a regular file"), "{e}");
        assert!(std::fs::symlink_metadata(&fifo).unwrap().file_type().is_fifo(), "the FIFO is still there");
    }
    let mut tmp = sub.clone().into_os_string();
    tmp.push(".tmp");
    assert!(!std::path::Path::new(&tmp).exists(), "no temporary file left");
    // An existing regular file is replaced as before.
    let f = dir.join("existing.gguf");
    std::fs::write(&f, b"old").unwrap();
    let mut s = build_writer(None).begin(&f).unwrap();
    for (i, (_, ty, d)) in tensors().iter().enumerate() {
        s.write(&pattern(i, ds4_gguf::tensor_n_bytes(*ty, d).unwrap())).unwrap();
    }
    s.finish().unwrap();
    assert!(GgufFile::open(&f).is_ok());
    std::fs::remove_dir_all(&dir).ok();
}
