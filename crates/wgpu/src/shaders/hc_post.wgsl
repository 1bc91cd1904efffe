// Sub-layer exit of the hyper-connections (ds4_model::hc::post), in place on the streams:
// X'[c] = post[c] * y + sum_r comb[r][c] * X[r], one thread per (token, column) for every stream.
// k = 0: y is the sub-layer output row (attention). k > 0 (MoE): y = the sum of the token's k expert
// outputs (slots in ascending expert id: the order the CPU adds them) plus the shared expert's
// output when has_shared = 1.
struct Params {
    n_hc: u32,
    e: u32,
    k: u32,
    has_shared: u32,
    pad3: u32,      // (index = x + y * the dispatch's x extent: each step dispatches only its rows)
    pad0: u32,
    pad1: u32,
    pad2: u32,
}
struct Step { ntok: u32, pos: u32, pad0: u32, pad1: u32 }

@group(0) @binding(0) var<storage, read_write> x: array<f32>;  // ntok x n_hc x e
@group(0) @binding(1) var<storage, read> y: array<f32>;        // ntok x e, or ntok x k x e (experts)
@group(0) @binding(2) var<storage, read> sh: array<f32>;       // ntok x e (shared expert)
@group(0) @binding(3) var<storage, read> coef: array<f32>;     // ntok x (n_hc + n_hc^2): post, comb
@group(0) @binding(4) var<uniform> p: Params;
@group(0) @binding(5) var<uniform> step: Step;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let idx = gid.x + gid.y * nwg.x * 64u;
    let e = p.e;
    if (idx >= step.ntok * e) { return; }
    let t = idx / e;
    let j = idx - t * e;
    var yv: f32;
    if (p.k == 0u) {
        yv = y[idx];
    } else {
        yv = 0.0;
        for (var s = 0u; s < p.k; s++) { yv += y[(t * p.k + s) * e + j]; }
        if (p.has_shared != 0u) { yv += sh[idx]; }
    }
    let n = p.n_hc;
    let xb = t * n * e + j;
    let cb = t * (n + n * n);
    var xs: array<f32, 8>;
    for (var r = 0u; r < n; r++) { xs[r] = x[xb + r * e]; }
    for (var c = 0u; c < n; c++) {
        var acc = coef[cb + c] * yv;
        for (var r = 0u; r < n; r++) { acc += coef[cb + n + r * n + c] * xs[r]; }
        x[xb + c * e] = acc;
    }
}
