// Exact angle reduction and sin/cos of RoPE (see rope.wgsl): shared by `rope` and `kv_row`.
const TWO_PI: f32 = 6.283185307179586;

fn turns_of(pos: u32, t: vec4<f32>) -> f32 {
    let hi = f32(pos >> 12u) * 4096.0;
    let lo = f32(pos & 4095u);
    var r = fract(hi * t.x);
    r = fract(r + fract(lo * t.x));
    r = fract(r + fract(hi * t.y));
    r = fract(r + fract(lo * t.y));
    r = fract(r + fract(hi * t.z));
    r = fract(r + fract(lo * t.z));
    r = fract(r + fract(hi * t.w));
    r = fract(r + fract(lo * t.w));
    return r;
}

// (sin, cos) of 2pi * r for r in [0, 1).
fn sincos_turns(r: f32) -> vec2<f32> {
    let q = round(r * 4.0);
    let a = (r - q * 0.25) * TWO_PI;  // |a| <= pi/4
    let a2 = a * a;
    let s = a * (1.0 + a2 * (-1.0 / 6.0 + a2 * (1.0 / 120.0 + a2 * (-1.0 / 5040.0 + a2 * (1.0 / 362880.0)))));
    let c = 1.0 + a2 * (-0.5 + a2 * (1.0 / 24.0 + a2 * (-1.0 / 720.0 + a2 * (1.0 / 40320.0 + a2 * (-1.0 / 3628800.0)))));
    let k = u32(q) & 3u;
    if (k == 0u) { return vec2<f32>(s, c); }
    if (k == 1u) { return vec2<f32>(c, -s); }
    if (k == 2u) { return vec2<f32>(-s, -c); }
    return vec2<f32>(-c, s);
}
