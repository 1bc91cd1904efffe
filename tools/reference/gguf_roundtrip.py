#!/usr/bin/env python3
"""Cross-check DwarfStar's GGUF reader/writer against gguf-py (the reference Python implementation).

Needs `pip install gguf==0.19.0` (e.g. in /work/main/.venv-gguf, git-ignored).

Usage:
  gguf_roundtrip.py write-fixture OUT.gguf OUT.json
      Write a small GGUF with gguf-py's GGUFWriter holding every metadata value type (incl. nested
      arrays) and tensors of several ggml types, then dump it (with gguf-py's reader) to OUT.json.
      The dump is checked against the values that were written. Rust tests parse OUT.gguf with our
      reader and compare against OUT.json (crates/gguf/tests/fixtures/).
  gguf_roundtrip.py dump FILE.gguf
      Read FILE (e.g. written by our writer) with gguf-py's GGUFReader and print its metadata and
      tensors as JSON on stdout.

JSON format: {"version", "alignment", "data_offset", "metadata": [{"key", "value": TV}], "tensors": [...]}
with typed values TV = {"type": "u8"|...|"str"|"bool", "value": V} (floats also carry "bits", the IEEE
bit pattern, for exact comparison) and arrays {"type": "array", "elem_type": T, "value": [TV, ...]}.
Tensors: {"name", "type", "type_id", "dims" (GGUF order), "offset" (relative to the data section),
"n_bytes", "data_hex"}.
"""
import json
import sys

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter

TYPE_NAMES = {
    GGUFValueType.UINT8: "u8",
    GGUFValueType.INT8: "i8",
    GGUFValueType.UINT16: "u16",
    GGUFValueType.INT16: "i16",
    GGUFValueType.UINT32: "u32",
    GGUFValueType.INT32: "i32",
    GGUFValueType.FLOAT32: "f32",
    GGUFValueType.BOOL: "bool",
    GGUFValueType.STRING: "str",
    GGUFValueType.ARRAY: "array",
    GGUFValueType.UINT64: "u64",
    GGUFValueType.INT64: "i64",
    GGUFValueType.FLOAT64: "f64",
}


def scalar_tv(gtype, x):
    """Typed JSON value of one numpy scalar read by gguf-py."""
    name = TYPE_NAMES[gtype]
    if gtype == GGUFValueType.BOOL:
        return {"type": name, "value": bool(x)}
    if gtype == GGUFValueType.FLOAT32:
        f = np.float32(x)
        return {"type": name, "value": float(f), "bits": int(np.array([f]).view(np.uint32)[0])}
    if gtype == GGUFValueType.FLOAT64:
        f = np.float64(x)
        return {"type": name, "value": float(f), "bits": int(np.array([f]).view(np.uint64)[0])}
    return {"type": name, "value": int(x)}


def decode(parts, i, gtype):
    """Rebuild a (possibly nested) value from gguf-py's flat field parts, starting at parts[i]."""
    if gtype == GGUFValueType.STRING:
        return {"type": "str", "value": bytes(parts[i + 1]).decode("utf-8")}, i + 2
    if gtype == GGUFValueType.ARRAY:
        itype = GGUFValueType(int(parts[i][0]))
        n = int(parts[i + 1][0])
        i += 2
        items = []
        for _ in range(n):
            v, i = decode(parts, i, itype)
            items.append(v)
        return {"type": "array", "elem_type": TYPE_NAMES[itype], "value": items}, i
    return scalar_tv(gtype, parts[i][0]), i + 1


def dump(path):
    r = GGUFReader(path)
    meta = []
    for key, field in r.fields.items():
        if key.startswith("GGUF."):  # gguf-py's pseudo-fields for the header
            continue
        # parts: key length, key bytes, value type, value parts...
        gtype = GGUFValueType(int(field.parts[2][0]))
        value, end = decode(field.parts, 3, gtype)
        assert end == len(field.parts), key
        meta.append({"key": key, "value": value})
    tensors = []
    for t in r.tensors:
        data = t.data.tobytes()
        assert len(data) == t.n_bytes, t.name
        tensors.append({
            "name": t.name,
            "type": t.tensor_type.name,
            "type_id": int(t.tensor_type),
            "dims": [int(d) for d in t.shape],
            "offset": int(t.data_offset - r.data_offset),
            "n_bytes": int(t.n_bytes),
            "data_hex": data.hex(),
        })
    version = int(r.fields["GGUF.version"].parts[0][0])
    return {
        "version": version,
        "alignment": int(r.alignment),
        "data_offset": int(r.data_offset),
        "metadata": meta,
        "tensors": tensors,
    }


def fixture_spec():
    """(key, value, vtype, sub_type, expected typed JSON) for every kind of value."""
    T = GGUFValueType

    def tv(t, v):
        return scalar_tv(t, v) if t not in (T.STRING, T.ARRAY) else {"type": TYPE_NAMES[t], "value": v}

    def arr(et, items):
        return {"type": "array", "elem_type": TYPE_NAMES[et], "value": items}

    spec = []
    scalars = [
        ("t.u8", 200, T.UINT8), ("t.i8", -100, T.INT8), ("t.u16", 60000, T.UINT16),
        ("t.i16", -30000, T.INT16), ("t.u32", 4000000000, T.UINT32), ("t.i32", -2000000000, T.INT32),
        ("t.f32", 1.5, T.FLOAT32), ("t.f32_small", 1e-6, T.FLOAT32), ("t.bool_t", True, T.BOOL),
        ("t.bool_f", False, T.BOOL), ("t.u64", 2**64 - 1, T.UINT64), ("t.i64", -(2**63), T.INT64),
        ("t.f64", 0.1, T.FLOAT64), ("t.str", "héllo \"wörld\" ☃\n", T.STRING), ("t.str_empty", "", T.STRING),
    ]
    for k, v, t in scalars:
        spec.append((k, v, t, None, tv(t, v)))
    arrays = [
        ("a.u8", [0, 255], T.UINT8), ("a.i8", [-128, 127], T.INT8), ("a.u16", [1, 65535], T.UINT16),
        ("a.i16", [-32768, 5], T.INT16), ("a.u32", [0, 4, 128, 4294967295], T.UINT32),
        ("a.i32", [0, 4, -1], T.INT32), ("a.f32", [10.0, 0.25, -3.5], T.FLOAT32),
        ("a.bool", [True, False, True], T.BOOL), ("a.u64", [7, 2**40], T.UINT64),
        ("a.i64", [-5, 2**62], T.INT64), ("a.f64", [10.0, 1e-300], T.FLOAT64),
        ("a.str", ["a b", "", "ü"], T.STRING),
    ]
    for k, v, t in arrays:
        spec.append((k, v, T.ARRAY, t, arr(t, [tv(t, x) for x in v])))
    # Nested arrays: gguf-py infers inner element types (int -> i32, float -> f32, str, bytes -> u8).
    spec.append(("n.i32", [[1, 2], [3]], T.ARRAY, None,
                 arr(T.ARRAY, [arr(T.INT32, [tv(T.INT32, 1), tv(T.INT32, 2)]), arr(T.INT32, [tv(T.INT32, 3)])])))
    spec.append(("n.str", [["a"], ["b", "c"]], T.ARRAY, None,
                 arr(T.ARRAY, [arr(T.STRING, [tv(T.STRING, "a")]),
                               arr(T.STRING, [tv(T.STRING, "b"), tv(T.STRING, "c")])])))
    spec.append(("n.depth3", [[[1], [2, 3]], [[4]]], T.ARRAY, None,
                 arr(T.ARRAY, [
                     arr(T.ARRAY, [arr(T.INT32, [tv(T.INT32, 1)]), arr(T.INT32, [tv(T.INT32, 2), tv(T.INT32, 3)])]),
                     arr(T.ARRAY, [arr(T.INT32, [tv(T.INT32, 4)])]),
                 ])))
    spec.append(("n.mixed", [[1], ["x"], [1.5], b"\x01\x02"], T.ARRAY, T.ARRAY,
                 arr(T.ARRAY, [arr(T.INT32, [tv(T.INT32, 1)]), arr(T.STRING, [tv(T.STRING, "x")]),
                               arr(T.FLOAT32, [tv(T.FLOAT32, 1.5)]),
                               arr(T.UINT8, [tv(T.UINT8, 1), tv(T.UINT8, 2)])])))
    return spec


def fixture_tensors():
    rng = np.random.default_rng(20240601)
    Q = GGMLQuantizationType
    out = []
    # (name, array, raw_dtype, GGUF dims)
    out.append(("tok.f32", rng.standard_normal((3, 5)).astype(np.float32), None, [5, 3]))
    out.append(("w.f16", rng.standard_normal((2, 8)).astype(np.float16), None, [8, 2]))
    out.append(("w.i32", rng.integers(-1000, 1000, (6,)).astype(np.int32), None, [6]))
    out.append(("w.q8_0", rng.integers(0, 256, (4, 2 * 34), dtype=np.uint8), Q.Q8_0, [64, 4]))
    out.append(("w.q4_k", rng.integers(0, 256, (2, 144), dtype=np.uint8), Q.Q4_K, [256, 2]))
    out.append(("w.q2_k", rng.integers(0, 256, (1, 84), dtype=np.uint8), Q.Q2_K, [256, 1]))
    out.append(("w.iq2_xxs", rng.integers(0, 256, (3, 66), dtype=np.uint8), Q.IQ2_XXS, [256, 3]))
    out.append(("w.bf16", rng.integers(0, 256, (2, 8), dtype=np.uint8), Q.BF16, [4, 2]))
    out.append(("exps.q8_0", rng.integers(0, 256, (2, 2, 34), dtype=np.uint8), Q.Q8_0, [32, 2, 2]))
    return out


def write_fixture(gguf_path, json_path):
    w = GGUFWriter(gguf_path, "deepseek4")
    w.add_custom_alignment(64)
    spec = fixture_spec()
    for key, v, t, sub, _ in spec:
        w.add_key_value(key, v, t, sub_type=sub)
    tensors = fixture_tensors()
    for name, a, raw, _ in tensors:
        w.add_tensor(name, a, raw_dtype=raw)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()

    d = dump(gguf_path)
    # Check the dump against what was written (so the fixture does not just mirror gguf-py's reader).
    expect_meta = {"general.architecture": {"type": "str", "value": "deepseek4"},
                   "general.alignment": {"type": "u32", "value": 64}}
    for key, _, _, _, e in spec:
        expect_meta[key] = e
    got_meta = {m["key"]: m["value"] for m in d["metadata"]}
    assert got_meta == expect_meta, (got_meta, expect_meta)
    assert d["alignment"] == 64 and d["version"] == 3
    assert [t["name"] for t in d["tensors"]] == [t[0] for t in tensors]
    for t, (name, a, _, dims) in zip(d["tensors"], tensors):
        assert t["dims"] == dims, (name, t["dims"], dims)
        assert bytes.fromhex(t["data_hex"]) == a.tobytes(), name
        assert t["offset"] % 64 == 0
    with open(json_path, "w") as f:
        json.dump(d, f, indent=1, ensure_ascii=False)
        f.write("\n")


def main(argv):
    if len(argv) == 4 and argv[1] == "write-fixture":
        write_fixture(argv[2], argv[3])
    elif len(argv) == 3 and argv[1] == "dump":
        json.dump(dump(argv[2]), sys.stdout, ensure_ascii=False)
        sys.stdout.write("\n")
    else:
        sys.stderr.write(__doc__)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
