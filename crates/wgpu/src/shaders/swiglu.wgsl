// In place on a: a = silu(min(a, c)) * clamp(b, -c, c) (the V4 clamps; none when has_clamp == 0),
// over step.ntok rows of n values.
struct Params { n: u32, has_clamp: u32, c: f32, pad: u32 }
struct Step { ntok: u32, pos: u32, pad0: u32, pad1: u32 }
@group(0) @binding(0) var<storage, read_write> a: array<f32>;
@group(0) @binding(1) var<storage, read> b: array<f32>;
@group(0) @binding(2) var<uniform> p: Params;
@group(0) @binding(3) var<uniform> step: Step;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * 64u;
    if (i >= step.ntok * p.n) { return; }
    var av = a[i];
    var bv = b[i];
    if (p.has_clamp != 0u) {
        av = min(av, p.c);
        bv = clamp(bv, -p.c, p.c);
    }
    a[i] = av * (1.0 / (1.0 + exp(-av))) * bv;
}
