// Activation rows to Q8_0 as the CPU's `ds4_quant::quantize_row_q8_0` makes them (Precision::Fast):
// per block of 32, d = amax / 127, q = round-half-away(x / d) with 1 / d from the f32 d, d kept as its
// f16 rounding (round to nearest even, in integer code: WGSL leaves pack2x16float's rounding open).
// Thread = one block: xq gets its 8 words of packed signed bytes, xd the f16-rounded d as f32.
// Grid (blocks / 64 rounded up, tokens).
// (Bindings: quantize_common.wgsl; xd holds one scale a block of 32.)

// v rounded to the nearest f16 (ties to even), as an f32; f16 subnormals kept, overflow to inf.
fn f16_round(v: f32) -> f32 {
    let b = bitcast<u32>(v);
    let sign = b & 0x80000000u;
    let a = b & 0x7fffffffu;
    if (a >= 0x7f800000u) { return v; }                              // inf, NaN
    if (a >= 0x477ff000u) { return bitcast<f32>(sign | 0x7f800000u); } // >= 65520: inf
    if (a < 0x38800000u) {
        // Below 2^-14: multiples of 2^-24 (exact scalings by powers of two; round() ties to even).
        let n = round(bitcast<f32>(a) * 16777216.0);
        return bitcast<f32>(sign | bitcast<u32>(n * 5.9604644775390625e-8));
    }
    let r = (a + 0xfffu + ((a >> 13u) & 1u)) & 0xffffe000u;
    return bitcast<f32>(sign | r);
}

// round-half-away-from-zero of v (|v| <= 2^22), as the CPU's round_away_small.
fn round_away(v: f32) -> f32 {
    let y = abs(v);
    var n = round(y);
    if (y - n == 0.5) { n += 1.0; }
    return select(n, -n, v < 0.0);
}

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let blk = gid.x;
    let t = gid.y;
    let nb = qp.cols / 32u;
    if (blk >= nb || t >= step.ntok) { return; }
    let xb = t * qp.x_stride + 32u * blk;
    var v: array<f32, 32>;
    var amax = 0.0;
    for (var i = 0u; i < 32u; i++) {
        v[i] = x[xb + i];
        amax = max(amax, abs(v[i]));
    }
    let d = amax / 127.0;
    // 1 / d correctly rounded: the division's estimate refined by one Newton step (Vulkan allows
    // 2.5 ulp for a division).
    var id = 0.0;
    if (d != 0.0) {
        id = 1.0 / d;
        id = fma(id, fma(-d, id, 1.0), id);
    }
    let qb = (t * qp.cols + 32u * blk) / 4u;
    for (var k = 0u; k < 8u; k++) {
        var word = 0u;
        for (var j = 0u; j < 4u; j++) {
            let q = i32(round_away(v[4u * k + j] * id));
            word |= (u32(q) & 255u) << (8u * j);
        }
        xq[qb + k] = word;
    }
    xd[t * nb + blk] = f16_round(d);
}
