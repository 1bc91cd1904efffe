#!/usr/bin/env python3
"""Reference fixtures for the FP8 / FP4 / Hadamard "QAT" simulation steps (spec §2.2.4, §2.2.6).

transformers omits these steps, so they are tested alone, against torch:
  * FP8 E4M3FN: torch's `x.to(torch.float8_e4m3fn).float()` cast (round to nearest, ties to even code).
  * FP4 E2M1: torch 2.15 cannot cast to `torch.float4_e2m1fn_x2` ("copy_kernel not implemented"), so the
    rounding is the spec formula written with torch ops: for |v| < 2 the grid step is 0.5, for |v| in
    [2,4) it is 1, for [4,6] it is 2; q = torch.round(|v| / step) * step (torch.round = half to even,
    which is "ties to the even code" on this grid, as DS4 does; OFF's CPU ports use argmin = ties to the
    lower magnitude — they differ only on exact ties: 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5).
  * Walsh-Hadamard: Sylvester matrix H_1 = [1], H_2n = [[H, H], [H, -H]] (natural order), built with torch,
    y = (H_n @ x) / sqrt(n), computed in float64 and rounded to float32.

Block procedures (all in float32, like OFF's torch code):
  fp8_block (block 64):  amax = max(max|v|, 1e-4); s = exp2(ceil(log2(amax / 448)))  [float32 ops];
                         v <- float8_e4m3fn(clamp(v / s, -448, 448)) * s
  fp4_block (block 32):  amax = max(max|v|, 6 * 2^-126); s = exp2(ceil(log2(amax / 6)));
                         v <- e2m1(clamp(v / s, -6, 6)) * s
  indexer_qat (n=128):   v <- fp4_block(hadamard_128(v))   (per row; spec §2.2.6)
  kv_fp8 (head 128, rope 64 here, Flash 512/64): fp8_block on v[0 : n - rope], rope tail unchanged.

Usage: .venv-ref/bin/python tools/reference/qat_fixtures.py
Writes crates/model/tests/fixtures/qat/: qat.json (index) + *.bin (raw little-endian float32, C order).
Deterministic: re-running re-creates the files byte-identically.
"""
import json
import math
import os

import numpy as np
import torch

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
OUT = os.path.join(REPO, "crates", "model", "tests", "fixtures", "qat")


def fp8_cast(x):
    return x.to(torch.float8_e4m3fn).to(torch.float32)


def e2m1_round(x):
    """x already clamped to [-6, 6]; nearest E2M1 value, ties to even code."""
    a = x.abs()
    step = torch.where(a < 2.0, torch.full_like(a, 0.5), torch.where(a < 4.0, torch.ones_like(a), torch.full_like(a, 2.0)))
    q = torch.round(a / step) * step
    return torch.copysign(q, x)


def pow2_ceil_scale(amax, qmax):
    return torch.exp2(torch.ceil(torch.log2(amax / qmax)))


def fp8_block(x, block=64):
    assert x.dtype == torch.float32 and x.shape[-1] % block == 0
    xb = x.reshape(*x.shape[:-1], -1, block)
    amax = xb.abs().amax(dim=-1, keepdim=True).clamp(min=1e-4)
    s = pow2_ceil_scale(amax, torch.tensor(448.0, dtype=torch.float32))
    q = fp8_cast((xb / s).clamp(-448.0, 448.0)) * s
    return q.reshape(x.shape), s.squeeze(-1)


def fp4_block(x, block=32):
    assert x.dtype == torch.float32 and x.shape[-1] % block == 0
    xb = x.reshape(*x.shape[:-1], -1, block)
    amax = xb.abs().amax(dim=-1, keepdim=True).clamp(min=6.0 * 2.0 ** -126)
    s = pow2_ceil_scale(amax, torch.tensor(6.0, dtype=torch.float32))
    q = e2m1_round((xb / s).clamp(-6.0, 6.0)) * s
    return q.reshape(x.shape), s.squeeze(-1)


def sylvester(n):
    h = torch.ones((1, 1), dtype=torch.float64)
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], dim=1), torch.cat([h, -h], dim=1)], dim=0)
    assert h.shape[0] == n
    return h


def hadamard(x, n):
    h = sylvester(n)
    y = (x.to(torch.float64) @ h.T) / math.sqrt(n)
    return y.to(torch.float32)


def f32(a):
    return np.ascontiguousarray(np.asarray(a, dtype="<f4"))


def main():
    os.makedirs(OUT, exist_ok=True)
    g = torch.Generator().manual_seed(4242)
    files = {}

    def put(name, arr, meaning):
        a = f32(arr.numpy() if isinstance(arr, torch.Tensor) else arr)
        fn = f"{name}.bin"
        with open(os.path.join(OUT, fn), "wb") as f:
            f.write(a.tobytes())
        files[name] = {"file": fn, "shape": list(a.shape), "meaning": meaning}

    # ---- FP8 scalar cast (values already inside [-448, 448]; plus out-of-range inputs, clamped first)
    sub = 2.0 ** -9
    special = [0.0, -0.0, sub, -sub, 0.5 * sub, 1.5 * sub, 2.5 * sub, 0.49 * sub, 0.51 * sub, 7 * sub, 7.5 * sub,
               2.0 ** -6, 2.0 ** -6 * (1 + 1 / 16), 2.0 ** -6 * (1 - 1 / 32), 1.0, 1.0625, 1.1875, 1.125, -1.0625,
               2.0, 2.125, 2.375, 15.5, 240.0, 248.0, 256.0, 272.0, 416.0, 432.0, 440.0, 447.0, 448.0, -448.0,
               449.0, 463.9, 464.0, 500.0, 1e4, -1e4, 3.0e-4, -7.77e-3]
    rnd = torch.exp2(torch.rand(400, generator=g) * 22 - 13) * torch.sign(torch.rand(400, generator=g) - 0.5)
    fp8_in = torch.cat([torch.tensor(special, dtype=torch.float32), rnd.to(torch.float32)])
    fp8_out = fp8_cast(fp8_in.clamp(-448.0, 448.0))
    put("fp8_scalar_in", fp8_in, "inputs (some outside +-448)")
    put("fp8_scalar_out", fp8_out, "float8_e4m3fn(clamp(x, -448, 448)) as float32")

    # ---- FP8 block procedure on rows of 448 (= 7 blocks of 64, Flash's nope width)
    rows = []
    mags = [1.0, 1e-3, 37.0, 1e3, 1e-6, 0.5, 448.0 * 4, 5.0]
    for m in mags:
        rows.append(torch.randn(448, generator=g) * m)
    r = torch.zeros(448)
    r[:64] = torch.randn(64, generator=g) * 1e-7          # amax below the 1e-4 floor
    r[64:128] = 0.0                                        # all-zero block
    r[128:192] = torch.randn(64, generator=g); r[130] = 448.0        # amax exactly 448 -> s = 1
    r[192:256] = torch.randn(64, generator=g); r[200] = -896.0       # amax 896 -> s = 2
    r[256:320] = torch.randn(64, generator=g) * 0.01; r[257] = 448.0 * 2 ** -5  # exact power-of-two ratio
    nxt = float(np.nextafter(np.float32(448.0 * 8), np.float32(1e9)))
    r[320:384] = torch.randn(64, generator=g); r[321] = nxt          # just above 448*8 (f32 division edge)
    r[384:448] = torch.randn(64, generator=g) * 3; r[390] = -3.0e-4
    rows.append(r)
    fp8_rows = torch.stack(rows).to(torch.float32)
    q, s = fp8_block(fp8_rows, 64)
    put("fp8_block_in", fp8_rows, "rows of 448 = 7 blocks of 64")
    put("fp8_block_out", q, "block-64 FP8 simulation (spec 2.2.4)")
    put("fp8_block_scale", s, "per-block power-of-two scale s, [rows, 7]")

    # ---- KV row with rope tail: head 128, rope 64 -> FP8 on the first 64 dims only
    kv = torch.randn(6, 128, generator=g) * torch.tensor([[0.1], [1.0], [10.0], [300.0], [1e-5], [2.0]])
    kv = kv.to(torch.float32)
    kvq = kv.clone()
    kvq[:, :64] = fp8_block(kv[:, :64].contiguous(), 64)[0]
    put("kv_fp8_in", kv, "KV rows, head_dim 128, rope tail 64 (nope = first 64)")
    put("kv_fp8_out", kvq, "FP8 block simulation of nope dims, rope tail unchanged")

    # ---- FP4 scalar rounding (after clamping to +-6)
    fp4_special = [0.0, -0.0, 0.24, 0.25, 0.26, 0.5, 0.74, 0.75, 0.76, 1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 3.5,
                   4.0, 4.99, 5.0, 5.01, 6.0, -6.0, 6.5, -100.0, -0.25, -0.75, -1.25, -1.75, -2.5, -3.5, -5.0]
    fp4_in = torch.cat([torch.tensor(fp4_special, dtype=torch.float32),
                        ((torch.rand(300, generator=g) - 0.5) * 14).to(torch.float32)])
    put("fp4_scalar_in", fp4_in, "inputs (some outside +-6)")
    put("fp4_scalar_out", e2m1_round(fp4_in.clamp(-6.0, 6.0)), "E2M1 value of clamp(x,-6,6), ties to even code")

    # ---- FP4 block procedure on rows of 128 (4 blocks of 32)
    rows = [torch.randn(128, generator=g) * m for m in (1.0, 1e-2, 50.0, 1e-30, 3.0)]
    r = torch.randn(128, generator=g)
    r[0:32] = 0.0
    r[32:64] = torch.randn(32, generator=g); r[40] = 6.0             # amax 6 -> s = 1
    r[64:96] = torch.randn(32, generator=g) * 0.1; r[70] = -0.75      # amax 0.75 -> s = 2^-3
    r[96:128] = torch.randn(32, generator=g) * 1e-39                  # subnormal magnitudes, floor 6*2^-126
    rows.append(r)
    fp4_rows = torch.stack(rows).to(torch.float32)
    q, s = fp4_block(fp4_rows, 32)
    put("fp4_block_in", fp4_rows, "rows of 128 = 4 blocks of 32")
    put("fp4_block_out", q, "block-32 FP4 simulation (spec 2.2.6)")
    put("fp4_block_scale", s, "per-block power-of-two scale, [rows, 4]")

    # ---- Hadamard 128 and 32
    for n in (128, 32):
        x = torch.randn(8, n, generator=g).to(torch.float32)
        x[0] = 0.0; x[0, 0] = 1.0
        x[1] = 0.0; x[1, n - 1] = 1.0
        x[2] = 0.0; x[2, 5] = 1.0
        put(f"hadamard{n}_in", x, f"rows of {n}")
        put(f"hadamard{n}_out", hadamard(x, n), f"Sylvester (natural order) H_{n} x / sqrt({n}), f64 -> f32")

    # ---- indexer QAT: Hadamard-128 then FP4 block-32
    x = (torch.randn(8, 128, generator=g) * torch.tensor([[1.0], [0.1], [10], [1], [3], [0.01], [100], [1]])).to(torch.float32)
    h = hadamard(x, 128)
    put("indexer_qat_in", x, "indexer rows (q head or compressed key), 128")
    put("indexer_qat_hadamard", h, "after Hadamard-128")
    put("indexer_qat_out", fp4_block(h, 32)[0], "after Hadamard-128 and FP4 block-32")

    index = {
        "generator": "tools/reference/qat_fixtures.py",
        "reference": f"torch {torch.__version__}: float8_e4m3fn cast; E2M1 by formula with torch.round (half-even); "
                     "Sylvester Hadamard in float64",
        "format": "raw little-endian float32, C order",
        "procedures": __doc__.split("Block procedures")[1].split("Usage:")[0].strip(),
        "files": files,
    }
    with open(os.path.join(OUT, "qat.json"), "w") as f:
        json.dump(index, f, indent=1, sort_keys=True)
        f.write("\n")
    for fn in sorted(os.listdir(OUT)):
        print(f"  {fn}: {os.path.getsize(os.path.join(OUT, fn))} bytes")


if __name__ == "__main__":
    torch.set_num_threads(1)
    main()
