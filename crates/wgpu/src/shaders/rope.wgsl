// Rotary embedding, in place, on the tail of each head: x is [ntok][n_head][head_dim], the last
// 2 * npairs values of a head are adjacent pairs; pair k of token t turns by (pos + t) * freq_k
// (negated when `inverse`); in a batched step each row at its own position (seq.wgsl). WGSL has no f64, and an f32 angle loses ~pos * 2^-24 rad, so the angle
// is reduced exactly: the host gives turns_k = freq_k / 2pi (f64) as 4 f32 pieces of 12 significant
// bits each; pos (< 2^24) is split into two 12-bit halves, so every product piece * half is exact in
// f32 and so is its fractional part. The sum of the fractions (mod 1) is the angle in turns to
// ~1e-7, independent of pos. sin/cos are polynomials on [-pi/4, pi/4] plus the quadrant, so they do
// not depend on the accuracy of the platform's sin/cos (Vulkan allows 2^-11 absolute error).
struct Params { n_head: u32, head_dim: u32, npairs: u32, inverse: u32 }
@group(0) @binding(0) var<storage, read_write> x: array<f32>;
@group(0) @binding(1) var<storage, read> turns: array<vec4<f32>>;
@group(0) @binding(2) var<uniform> p: Params;
@group(0) @binding(3) var<uniform> step: Step;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * 64u;
    let per_tok = p.n_head * p.npairs;
    if (i >= step.ntok * per_tok) { return; }
    let t = i / per_tok;
    let hk = i % per_tok;
    let h = hk / p.npairs;
    let k = hk % p.npairs;
    var sc = sincos_turns(turns_of(row_pos(t), turns[k]));
    if (p.inverse != 0u) { sc.x = -sc.x; }
    let j = (t * p.n_head + h) * p.head_dim + p.head_dim - 2u * p.npairs + 2u * k;
    let x0 = x[j];
    let x1 = x[j + 1u];
    x[j] = x0 * sc.y - x1 * sc.x;
    x[j + 1u] = x0 * sc.x + x1 * sc.y;
}
