// Rotary embedding, in place, on the tail of each head: x is [ntok][n_head][head_dim], the last
// 2 * npairs values of a head are adjacent pairs; pair k of token t turns by (pos + t) * freq_k
// (negated when `inverse`). WGSL has no f64, and an f32 angle loses ~pos * 2^-24 rad, so the angle
// is reduced exactly: the host gives turns_k = freq_k / 2pi (f64) as 4 f32 pieces of 12 significant
// bits each; pos (< 2^24) is split into two 12-bit halves, so every product piece * half is exact in
// f32 and so is its fractional part. The sum of the fractions (mod 1) is the angle in turns to
// ~1e-7, independent of pos. sin/cos are polynomials on [-pi/4, pi/4] plus the quadrant, so they do
// not depend on the accuracy of the platform's sin/cos (Vulkan allows 2^-11 absolute error).
struct Params { n_head: u32, head_dim: u32, npairs: u32, inverse: u32 }
struct Step { ntok: u32, pos: u32, pad0: u32, pad1: u32 }
@group(0) @binding(0) var<storage, read_write> x: array<f32>;
@group(0) @binding(1) var<storage, read> turns: array<vec4<f32>>;
@group(0) @binding(2) var<uniform> p: Params;
@group(0) @binding(3) var<uniform> step: Step;

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

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * 64u;
    let per_tok = p.n_head * p.npairs;
    if (i >= step.ntok * per_tok) { return; }
    let t = i / per_tok;
    let hk = i % per_tok;
    let h = hk / p.npairs;
    let k = hk % p.npairs;
    var sc = sincos_turns(turns_of(step.pos + t, turns[k]));
    if (p.inverse != 0u) { sc.x = -sc.x; }
    let j = (t * p.n_head + h) * p.head_dim + p.head_dim - 2u * p.npairs + 2u * k;
    let x0 = x[j];
    let x1 = x[j + 1u];
    x[j] = x0 * sc.y - x1 * sc.x;
    x[j + 1u] = x0 * sc.x + x1 * sc.y;
}
