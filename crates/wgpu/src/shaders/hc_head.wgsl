// Output-head collapse, one workgroup per row (ds4_model::hc::head_collapse + the output norm):
// w[s] = sigmoid((hc_fn . X)[s] / rms(X) * scale + base[s]) + eps, out = rms_norm(sum_s w[s] X[s]) * norm.
// `last` = 1: only the step's last token, into out row 0.
struct Params {
    n_hc: u32,
    e: u32,
    last: u32,
    pad0: u32,
    hc_eps: f32,
    rms_eps: f32,
    pad1: u32,
    pad2: u32,
}
struct Step { ntok: u32, pos: u32, pad0: u32, pad1: u32 }

@group(0) @binding(0) var<storage, read> x: array<f32>;         // ntok x n_hc x e
@group(0) @binding(1) var<storage, read> mix: array<f32>;       // ntok x n_hc (raw projections)
@group(0) @binding(2) var<storage, read_write> out: array<f32>; // rows x e
@group(0) @binding(3) var<storage, read> hw: array<f32>;        // scale, base[n_hc], norm[e]
@group(0) @binding(4) var<uniform> p: Params;
@group(0) @binding(5) var<uniform> step: Step;

var<workgroup> wts: array<f32, 8>;

// Built per shape like hc_pre.wgsl (hc_streams.wgsl: a thread's stream values in registers).
@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let row = wid.x;
    if (row >= step.ntok || (p.last != 0u && row > 0u)) { return; }
    let t = select(row, step.ntok - 1u, p.last != 0u);
    var xr = load_streams(lid, t * N * E);
    let inv = flat_inv_rms(lid, &xr, p.rms_eps);
    if (lid < N) { wts[lid] = sigmoid(mix[t * N + lid] * inv * hw[0] + hw[1u + lid]) + p.hc_eps; }
    workgroupBarrier();
    var yr: array<f32, C>;
    let inv2 = collapse(lid, &xr, wts, &yr, p.rms_eps);
    let nb = 1u + N;
    let ob = row * E;
    for (var m = 0u; m < C; m++) {
        let j = lid + m * WG;
        if (j < E) { out[ob + j] = yr[m] * inv2 * hw[nb + j]; }
    }
}
