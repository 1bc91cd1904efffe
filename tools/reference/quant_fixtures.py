#!/usr/bin/env python3
"""Generate ds4-quant test fixtures from independent references (gguf-py and ggml-python).

Setup (once; the venv path is git-ignored):
    python3.11 -m venv .venv-quant
    .venv-quant/bin/pip install gguf==0.19.0 numpy ggml-python==0.0.45
Run from the repository root:
    .venv-quant/bin/python tools/reference/quant_fixtures.py

Writes crates/quant/tests/fixtures/{dequant,quantize}.bin in the "DSQF" container:
    b"DSQF", u32 version=1, u32 n_records,
    per record: u16 len + name (utf-8), u32 ggml type id, u32 n_fields,
                per field: u16 len + key (utf-8), u32 byte length, bytes.
All integers little-endian; f32 arrays stored as raw little-endian f32.

dequant.bin: per type, random *valid* blocks (f16 scales in a sane range, other bytes
random) -> field "raw" (bytes) and "f32" = gguf.quants.dequantize(raw).
quantize.bin: fixed inputs -> field "src" (f32), "n_per_row" (u32), optional "imatrix" (f32),
and "q" = ggml_quantize_chunk(...) output (ggml-python, i.e. ggml's C quantizers);
Q8_K uses the ggml CPU backend's from_float (quantize_row_q8_K).
"""
import ctypes
import os
import struct
import sys

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT = os.path.join(ROOT, "crates", "quant", "tests", "fixtures")


def write_container(path, records):
    buf = bytearray(b"DSQF")
    buf += struct.pack("<II", 1, len(records))
    for name, ty, fields in records:
        nb = name.encode()
        buf += struct.pack("<H", len(nb)) + nb + struct.pack("<II", ty, len(fields))
        for key, data in fields:
            kb = key.encode()
            data = bytes(data)
            buf += struct.pack("<H", len(kb)) + kb + struct.pack("<I", len(data)) + data
    with open(path, "wb") as f:
        f.write(buf)
    print(f"wrote {path}: {len(buf)} bytes, {len(records)} records")


def f16_bytes(rng, n, lo, hi):
    return rng.uniform(lo, hi, size=n).astype(np.float16).view(np.uint8).reshape(n, 2)


def random_blocks(rng, ty, nblocks):
    """Random valid blocks: sane f16 scale fields, uniformly random other bytes."""
    if ty == T.Q8_0:
        b = rng.integers(0, 256, size=(nblocks, 34), dtype=np.uint8)
        b[:, 0:2] = f16_bytes(rng, nblocks, 0.01, 0.1)
    elif ty == T.Q2_K:
        b = rng.integers(0, 256, size=(nblocks, 84), dtype=np.uint8)
        b[:, 80:82] = f16_bytes(rng, nblocks, 0.01, 0.1)
        b[:, 82:84] = f16_bytes(rng, nblocks, 0.005, 0.05)
    elif ty == T.Q4_K:
        b = rng.integers(0, 256, size=(nblocks, 144), dtype=np.uint8)
        b[:, 0:2] = f16_bytes(rng, nblocks, 0.01, 0.1)
        b[:, 2:4] = f16_bytes(rng, nblocks, 0.005, 0.05)
    elif ty == T.IQ2_XXS:
        b = rng.integers(0, 256, size=(nblocks, 66), dtype=np.uint8)
        b[:, 0:2] = f16_bytes(rng, nblocks, 0.01, 0.1)
    elif ty == T.F16:
        b = rng.normal(0, 1, size=nblocks).astype(np.float16).view(np.uint8)
    elif ty == T.BF16:
        x = rng.normal(0, 1, size=nblocks).astype(np.float32)
        b = (x.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8)
    elif ty == T.F32:
        b = rng.normal(0, 1, size=nblocks).astype(np.float32).view(np.uint8)
    else:
        raise ValueError(ty)
    return np.ascontiguousarray(b).reshape(-1)


def dequant_records(rng):
    recs = []
    cases = [
        (T.Q8_0, [1, 7, 37]),
        (T.Q2_K, [1, 3, 13]),
        (T.Q4_K, [1, 3, 13]),
        (T.IQ2_XXS, [1, 3, 13]),
        (T.F16, [1, 33, 1001]),
        (T.BF16, [1, 33, 1001]),
        (T.F32, [5, 77]),
    ]
    for ty, counts in cases:
        for nb in counts:
            raw = random_blocks(rng, ty, nb)
            out = dequantize(raw.reshape(1, -1), ty).astype(np.float32).reshape(-1)
            assert np.all(np.isfinite(out)), ty
            recs.append((f"{ty.name}_{nb}", int(ty), [("raw", raw.tobytes()), ("f32", out.tobytes())]))
    return recs


def ggml_quantize(ty, src, n_per_row, imatrix=None):
    import ggml

    src = np.ascontiguousarray(src, dtype=np.float32)
    nrows = src.size // n_per_row
    row_bytes = gguf.GGML_QUANT_SIZES[ty][1] * n_per_row // gguf.GGML_QUANT_SIZES[ty][0]
    dst = (ctypes.c_uint8 * (row_bytes * nrows))()
    src_c = src.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
    im = None
    if imatrix is not None:
        imatrix = np.ascontiguousarray(imatrix, dtype=np.float32)
        im = imatrix.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
    n = ggml.ggml_quantize_chunk(int(ty), src_c, ctypes.cast(dst, ctypes.c_void_p), 0, nrows, n_per_row, im)
    assert n == row_bytes * nrows, (n, row_bytes, nrows)
    return bytes(dst)


def ggml_q8_k_ref(src):
    import ggml

    src = np.ascontiguousarray(src, dtype=np.float32)
    # The base traits of Q8_K carry no from_float_ref in this ggml build (NULL); the CPU
    # backend's from_float (quantize_row_q8_K) is used instead.
    traits = ggml.ggml_get_type_traits_cpu(int(T.Q8_K)).contents
    dst = (ctypes.c_uint8 * (292 * (src.size // 256)))()
    traits.from_float(src.ctypes.data_as(ctypes.POINTER(ctypes.c_float)), ctypes.cast(dst, ctypes.c_void_p), src.size)
    return bytes(dst)


def quant_inputs(rng, nrows, n_per_row):
    """Gaussian rows with per-row scale, a few outliers, one constant row segment and zeros."""
    x = rng.normal(0, 1, size=(nrows, n_per_row)).astype(np.float32)
    x *= rng.uniform(0.01, 2.0, size=(nrows, 1)).astype(np.float32)
    idx = rng.integers(0, x.size, size=x.size // 97)
    x.reshape(-1)[idx] *= 8.0
    x[0, :256] = np.abs(x[0, :256])  # all-positive block (min clamps to 0)
    x[-1, -32:] = 0.0  # zero tail
    return x


def quantize_records(rng):
    recs = []
    for ty, nrows, npr in [(T.Q8_0, 4, 512), (T.Q8_K, 4, 512), (T.Q4_K, 8, 1024), (T.Q2_K, 8, 1024)]:
        x = quant_inputs(rng, nrows, npr)
        q = ggml_q8_k_ref(x) if ty == T.Q8_K else ggml_quantize(ty, x, npr)
        recs.append((f"{ty.name}", int(ty), [("src", x.tobytes()), ("n_per_row", struct.pack("<I", npr)), ("q", q)]))
    # IQ2_XXS needs an importance matrix; ds4-style: imatrix[c] = sum over rows of x[r, c]^2.
    for name, nrows, npr in [("IQ2_XXS", 8, 1024), ("IQ2_XXS_b", 4, 2048)]:
        x = quant_inputs(rng, nrows, npr)
        im = (x.astype(np.float32) ** 2).sum(axis=0).astype(np.float32)
        q = ggml_quantize(T.IQ2_XXS, x, npr, im)
        recs.append((name, int(T.IQ2_XXS), [("src", x.tobytes()), ("n_per_row", struct.pack("<I", npr)),
                                            ("imatrix", im.tobytes()), ("q", q)]))
    return recs


def main():
    os.makedirs(OUT, exist_ok=True)
    rng = np.random.default_rng(20250704)
    write_container(os.path.join(OUT, "dequant.bin"), dequant_records(rng))
    write_container(os.path.join(OUT, "quantize.bin"), quantize_records(rng))


if __name__ == "__main__":
    sys.exit(main())
