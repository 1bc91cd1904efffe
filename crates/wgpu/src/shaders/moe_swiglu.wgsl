// Routed experts' activation, in place on a: a = silu(min(a, c)) * clamp(b, -c, c) * w[slot]
// (ds4_model::moe::swiglu_clamped times the routing weight; no clamp when has_clamp == 0), over
// step.ntok * k slot rows of n values.
struct Params { n: u32, k: u32, has_clamp: u32, c: f32, pad3: u32, pad0: u32, pad1: u32, pad2: u32 }
struct Step { ntok: u32, pos: u32, pad0: u32, pad1: u32 }
@group(0) @binding(0) var<storage, read_write> a: array<f32>;
@group(0) @binding(1) var<storage, read> b: array<f32>;
@group(0) @binding(2) var<storage, read> wts: array<f32>;
@group(0) @binding(3) var<uniform> p: Params;
@group(0) @binding(4) var<uniform> step: Step;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * 64u;
    if (i >= step.ntok * p.k * p.n) { return; }
    var av = a[i];
    var bv = b[i];
    if (p.has_clamp != 0u) {
        av = min(av, p.c);
        bv = clamp(bv, -p.c, p.c);
    }
    a[i] = av * (1.0 / (1.0 + exp(-av))) * bv * wts[i / p.n];
}
