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

@group(0) @binding(0) var<storage, read> x4: array<vec4<f32>>;  // ntok x n_hc x e / 4
@group(0) @binding(1) var<storage, read> mix: array<f32>;       // ntok x n_hc (raw projections)
@group(0) @binding(2) var<storage, read_write> out: array<f32>; // rows x e
@group(0) @binding(3) var<storage, read> hw: array<f32>;        // scale, base[n_hc], norm[e]
@group(0) @binding(4) var<uniform> p: Params;
@group(0) @binding(5) var<uniform> step: Step;

var<workgroup> wts: array<f32, 8>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let row = wid.x;
    if (row >= step.ntok || (p.last != 0u && row > 0u)) { return; }
    let t = select(row, step.ntok - 1u, p.last != 0u);
    let n = p.n_hc;
    let e4 = p.e / 4u;
    let xb4 = t * n * e4;
    let inv = 1.0 / sqrt(wg_sum(lid, sum_squares(lid, xb4, n * e4)) / f32(n * p.e) + p.rms_eps);
    if (lid < n) { wts[lid] = sigmoid(mix[t * n + lid] * inv * hw[0] + hw[1u + lid]) + p.hc_eps; }
    workgroupBarrier();
    var w: array<f32, 8>;
    for (var s = 0u; s < n; s++) { w[s] = wts[s]; }
    let ob = row * p.e;
    var ss2 = vec4<f32>(0.0);
    for (var j = lid; j < e4; j += WG) {
        let acc = collapse4(xb4, e4, n, j, w);
        out[ob + 4u * j] = acc.x;
        out[ob + 4u * j + 1u] = acc.y;
        out[ob + 4u * j + 2u] = acc.z;
        out[ob + 4u * j + 3u] = acc.w;
        ss2 += acc * acc;
    }
    let inv2 = 1.0 / sqrt(wg_sum(lid, (ss2.x + ss2.y) + (ss2.z + ss2.w)) / f32(p.e) + p.rms_eps);
    let nb = 1u + n;
    for (var j = lid; j < p.e; j += WG) {
        out[ob + j] = out[ob + j] * inv2 * hw[nb + j];
    }
}
