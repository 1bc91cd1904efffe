// Quantization-aware simulation, bit-exact with ds4_model::qat: block scales are powers of two found
// from exact products (448 * 2^p and 6 * 2^p are exact), values are scaled by multiplying with an
// exact power of two (a division could be off by ulps on Vulkan), and `round` is ties-to-even.
const E4M3_MAX: f32 = 448.0;
const E2M1_MAX: f32 = 6.0;

// 2^e for -126 <= e <= 127.
fn pow2(e: i32) -> f32 {
    return bitcast<f32>(u32(e + 127) << 23u);
}

// The least p with m * 2^p >= a (a > 0 normal, m in {448, 6}), as in qat::pow2_ceil(a / m).
fn scale_exp(a: f32, m: f32) -> i32 {
    var p = i32((bitcast<u32>(a / m) >> 23u) & 255u) - 127;
    p = clamp(p, -125, 126);
    // The division is approximate: step to the exact boundary.
    for (var i = 0; i < 4; i++) {
        if (m * pow2(p) < a) { p += 1; }
    }
    for (var i = 0; i < 4; i++) {
        if (m * pow2(p - 1) >= a) { p -= 1; }
    }
    return p;
}

// qat::e4m3_round for |v| <= 448.
fn e4m3_round(v: f32) -> f32 {
    let a = min(abs(v), E4M3_MAX);
    if (a == 0.0) { return v; }
    let e = i32((bitcast<u32>(a) >> 23u) & 255u) - 127;
    let se = select(e - 3, -9, e < -6);
    let r = min(round(a * pow2(-se)) * pow2(se), E4M3_MAX);
    return select(r, -r, v < 0.0);
}

// qat::e2m1_round: magnitudes {0, .5, 1, 1.5, 2, 3, 4, 6}, ties to the even code.
fn e2m1_round(v: f32) -> f32 {
    let a = min(abs(v), E2M1_MAX);
    var r: f32;
    if (a < 2.0) {
        r = round(a * 2.0) * 0.5;
    } else if (a < 4.0) {
        r = round(a);
    } else {
        r = select(6.0, 4.0, a <= 5.0);
    }
    return select(r, -r, v < 0.0);
}
