// Two f16 (low half first) -> f32 by integer arithmetic, for adapters without SHADER_F16_IN_F32.
// Exact for every f16: subnormals as m * 2^-24 (no f32 denormals, which GPUs may flush), normals by
// re-biasing the exponent, inf/NaN kept.
fn h1(h: u32) -> f32 {
    let e = (h >> 10u) & 31u;
    let m = h & 1023u;
    let sign = (h & 0x8000u) << 16u;
    if (e == 0u) {
        let v = f32(m) * 5.9604644775390625e-8;
        return select(v, -v, sign != 0u);
    }
    if (e == 31u) { return bitcast<f32>(sign | 0x7f800000u | (m << 13u)); }
    return bitcast<f32>(sign | ((e + 112u) << 23u) | (m << 13u));
}
fn unpack_h2(v: u32) -> vec2<f32> {
    return vec2<f32>(h1(v & 0xffffu), h1(v >> 16u));
}
