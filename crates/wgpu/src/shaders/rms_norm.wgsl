// In place, per row of n values (rows = step.ntok x per_tok; per_tok 0 counts as 1): x = x /
// sqrt(mean(x^2) + eps) [* g]. One workgroup of 256 per row; sum of squares by a tree in workgroup memory.
struct Params { n: u32, has_g: u32, eps: f32, per_tok: u32 }
struct Step { ntok: u32, pos: u32, pad0: u32, pad1: u32 }
@group(0) @binding(0) var<storage, read_write> x: array<f32>;
@group(0) @binding(1) var<storage, read> g: array<f32>;
@group(0) @binding(2) var<uniform> p: Params;
@group(0) @binding(3) var<uniform> step: Step;

const WG: u32 = 256u;
var<workgroup> red: array<f32, WG>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let r = wid.x;
    if (r >= step.ntok * max(p.per_tok, 1u)) { return; }
    let base = r * p.n;
    var ss = 0.0;
    for (var i = lid; i < p.n; i += WG) {
        let v = x[base + i];
        ss += v * v;
    }
    red[lid] = ss;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if (lid < s) { red[lid] += red[lid + s]; }
        workgroupBarrier();
    }
    let inv = 1.0 / sqrt(red[0] / f32(p.n) + p.eps);
    for (var i = lid; i < p.n; i += WG) {
        var v = x[base + i] * inv;
        if (p.has_g != 0u) { v = v * g[i]; }
        x[base + i] = v;
    }
}
