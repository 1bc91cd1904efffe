//! Cross-checks against gguf-py (tools/reference/gguf_roundtrip.py):
//! 1. our reader parses a gguf-py-written fixture to exactly the values gguf-py reports;
//! 2. gguf-py reads a file written by our writer to exactly what our reader sees (skipped, with a
//!    message, when the venv with gguf-py is absent).
use ds4_gguf::{GgmlType, GgufFile, GgufWriter, MetaType, MetaValue};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

fn tv(v: &MetaValue) -> Value {
    let t = v.meta_type().name();
    match v {
        MetaValue::F32(x) => json!({"type": t, "bits": x.to_bits()}),
        MetaValue::F64(x) => json!({"type": t, "bits": x.to_bits()}),
        MetaValue::Str(s) => json!({"type": t, "value": s}),
        MetaValue::Bool(b) => json!({"type": t, "value": b}),
        MetaValue::Array(et, items) => {
            json!({"type": t, "elem_type": et.name(), "value": items.iter().map(tv).collect::<Vec<_>>()})
        }
        MetaValue::U64(x) => json!({"type": t, "value": x}),
        MetaValue::I64(x) => json!({"type": t, "value": x}),
        other => json!({"type": t, "value": other.as_i64().unwrap()}),
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Our reader's view in the JSON format of gguf_roundtrip.py (floats compared by bit pattern).
fn to_json(f: &GgufFile) -> Value {
    json!({
        "version": f.version(),
        "alignment": f.alignment(),
        "data_offset": f.data_offset(),
        "metadata": f.metadata().iter().map(|(k, v)| json!({"key": k, "value": tv(v)})).collect::<Vec<_>>(),
        "tensors": f.tensors().iter().map(|t| json!({
            "name": t.name,
            "type": t.ty.name(),
            "type_id": t.ty as u32,
            "dims": t.dims,
            "offset": t.offset,
            "n_bytes": t.n_bytes,
            "data_hex": hex(f.tensor_data(t)),
        })).collect::<Vec<_>>(),
    })
}

/// Drop the decimal "value" of floats (compared through "bits").
fn normalize(v: &mut Value) {
    match v {
        Value::Object(m) => {
            if m.contains_key("bits") {
                m.remove("value");
            }
            m.values_mut().for_each(normalize);
        }
        Value::Array(a) => a.iter_mut().for_each(normalize),
        _ => {}
    }
}

fn assert_same(mut ours: Value, mut theirs: Value) {
    normalize(&mut ours);
    normalize(&mut theirs);
    if ours != theirs {
        let o = serde_json::to_string_pretty(&ours).unwrap();
        let t = serde_json::to_string_pretty(&theirs).unwrap();
        for (i, (a, b)) in o.lines().zip(t.lines()).enumerate() {
            assert_eq!(a, b, "first difference at line {i}");
        }
        panic!("JSON differs in length:\nours:\n{o}\ntheirs:\n{t}");
    }
}

#[test]
fn reads_gguf_py_fixture_exactly() {
    let f = GgufFile::open(fixtures().join("gguf_py.gguf")).unwrap();
    let expected: Value =
        serde_json::from_str(&std::fs::read_to_string(fixtures().join("gguf_py.json")).unwrap()).unwrap();
    assert_same(to_json(&f), expected);
    // Spot checks through the typed API.
    assert_eq!(f.alignment(), 64);
    assert_eq!(f.get_str("general.architecture").unwrap(), "deepseek4");
    assert_eq!(f.get_u64("t.u64").unwrap(), u64::MAX);
    assert_eq!(f.get_f32("t.f64").unwrap(), 0.1f32);
    assert_eq!(f.get_u32_array("a.u32").unwrap(), vec![0, 4, 128, u32::MAX]);
    assert_eq!(f.get_str_array("a.str").unwrap(), vec!["a b", "", "ü"]);
    let t = f.tensor("w.q8_0").unwrap();
    assert_eq!((t.ty, t.dims.clone(), t.n_bytes), (GgmlType::Q8_0, vec![64, 4], 4 * 2 * 34));
    let n = f.get("n.mixed").unwrap();
    assert_eq!(n.type_name(), "array<array<mixed>>");
    assert_eq!(f.get("n.depth3").unwrap().type_name(), "array<array<array<i32>>>");
}

fn venv_python() -> Option<PathBuf> {
    let p = root().join(".venv-gguf/bin/python");
    p.exists().then_some(p)
}

#[test]
fn gguf_py_reads_our_writer() {
    let Some(py) = venv_python() else {
        eprintln!("SKIP gguf_py_reads_our_writer: no .venv-gguf (pip install gguf==0.19.0 there)");
        return;
    };
    let mut w = GgufWriter::new();
    w.set_alignment(128);
    w.add_kv("general.architecture", MetaValue::Str("deepseek4".into()));
    w.add_kv("u8", MetaValue::U8(7));
    w.add_kv("i8", MetaValue::I8(-7));
    w.add_kv("u16", MetaValue::U16(65535));
    w.add_kv("i16", MetaValue::I16(-1));
    w.add_kv("u32", MetaValue::U32(43));
    w.add_kv("i32", MetaValue::I32(-43));
    w.add_kv("f32", MetaValue::F32(1e-6));
    w.add_kv("bool", MetaValue::Bool(true));
    w.add_kv("str", MetaValue::Str("joyai-llm ☃".into()));
    w.add_kv("u64", MetaValue::U64(u64::MAX));
    w.add_kv("i64", MetaValue::I64(i64::MIN));
    w.add_kv("f64", MetaValue::F64(0.1));
    w.add_kv("arr.f32", MetaValue::Array(MetaType::F32, vec![MetaValue::F32(10.0); 43]));
    w.add_kv("arr.empty", MetaValue::Array(MetaType::I32, vec![]));
    w.add_kv("arr.str", MetaValue::Array(MetaType::Str, vec![MetaValue::Str("Ġ t".into()), MetaValue::Str("".into())]));
    w.add_kv(
        "arr.nested",
        MetaValue::Array(
            MetaType::Array,
            vec![
                MetaValue::Array(MetaType::U16, vec![MetaValue::U16(1)]),
                MetaValue::Array(MetaType::Array, vec![MetaValue::Array(MetaType::Str, vec![MetaValue::Str("z".into())])]),
            ],
        ),
    );
    let ts: Vec<(&str, GgmlType, Vec<u64>)> = vec![
        ("a", GgmlType::F32, vec![3]),
        ("b", GgmlType::Q8_0, vec![32, 3]),
        ("c", GgmlType::Q2_K, vec![256, 1, 2]),
        ("d", GgmlType::IQ2_XXS, vec![256]),
        ("e", GgmlType::I32, vec![6, 2]),
        ("f", GgmlType::F16, vec![5]),
        ("g", GgmlType::Q4_K, vec![512]),
    ];
    let mut datas = Vec::new();
    for (i, (n, ty, d)) in ts.iter().enumerate() {
        w.add_tensor_info(n, *ty, d).unwrap();
        let nb = ds4_gguf::tensor_n_bytes(*ty, d).unwrap();
        datas.push((0..nb).map(|j| (j * 7 + i as u64 * 13) as u8).collect::<Vec<u8>>());
    }
    let dir = std::env::temp_dir().join(format!("ds4-gguf-py-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("ours.gguf");
    let mut s = w.begin(&path).unwrap();
    for d in &datas {
        for c in d.chunks(50) {
            s.write(c).unwrap();
        }
    }
    s.finish().unwrap();
    let out = std::process::Command::new(py)
        .arg(root().join("tools/reference/gguf_roundtrip.py"))
        .arg("dump")
        .arg(&path)
        .output()
        .unwrap();
    assert!(out.status.success(), "gguf-py failed: {}", String::from_utf8_lossy(&out.stderr));
    let theirs: Value = serde_json::from_slice(&out.stdout).unwrap();
    let f = GgufFile::open(&path).unwrap();
    assert_eq!(f.alignment(), 128);
    assert_same(to_json(&f), theirs);
    std::fs::remove_dir_all(&dir).ok();
}
