// Sub-layer entry of the hyper-connections, one workgroup per token (ds4_model::hc + the sub-layer
// norm): mix = (hc_fn . X) / rms(X) (the projection of the raw streams is done before, by a mat-vec:
// the flat RMS factor commutes with it), pre/post weights and the Sinkhorn-balanced comb matrix from
// mix * scale + base, then xn = rms_norm(sum_s pre[s] X[s]) * norm. post and comb go to `coef` for
// the sub-layer exit.
struct Params {
    n_hc: u32,
    e: u32,
    nm: u32,        // (2 + n_hc) * n_hc
    iters: u32,     // Sinkhorn iterations (the first is the row softmax + column normalisation)
    hc_eps: f32,
    rms_eps: f32,
    pad0: u32,
    pad1: u32,
}
struct Step { ntok: u32, pos: u32, pad0: u32, pad1: u32 }

@group(0) @binding(0) var<storage, read> x: array<f32>;       // ntok x n_hc x e
@group(0) @binding(1) var<storage, read> mix: array<f32>;     // ntok x nm (raw projections)
@group(0) @binding(2) var<storage, read_write> xn: array<f32>; // ntok x e
@group(0) @binding(3) var<storage, read_write> coef: array<f32>; // ntok x (n_hc + n_hc^2): post, comb
@group(0) @binding(4) var<storage, read> hw: array<f32>;      // scale[3], base[nm], norm[e]
@group(0) @binding(5) var<uniform> p: Params;
@group(0) @binding(6) var<uniform> step: Step;

const MAX_HC: u32 = 8u;
var<workgroup> pre: array<f32, MAX_HC>;

// The Sinkhorn matrix of token t from its scaled mix (as hc::pre_from_mix), by one thread in its own
// memory: no barrier (one a half-step took when a thread owned each element), each row and column
// summed in index order as the CPU sums it.
fn sinkhorn(t: u32, inv: f32) {
    let n = p.n_hc;
    let nn = n * n;
    let mb = t * p.nm + 2u * n;
    let cb = t * (n + nn) + n;
    let eps = p.hc_eps;
    var c: array<f32, 64>;
    for (var i = 0u; i < nn; i++) { c[i] = mix[mb + i] * inv * hw[2] + hw[3u + 2u * n + i]; }
    for (var it = 0u; it < max(p.iters, 1u); it++) {
        // Row step: the softmax + eps first, then the normalisation by the row sum.
        for (var r = 0u; r < n; r++) {
            let b = r * n;
            if (it == 0u) {
                var mx = c[b];
                for (var j = 1u; j < n; j++) { mx = max(mx, c[b + j]); }
                var s = 0.0;
                for (var j = 0u; j < n; j++) {
                    c[b + j] = exp(c[b + j] - mx);
                    s += c[b + j];
                }
                for (var j = 0u; j < n; j++) { c[b + j] = c[b + j] / s + eps; }
            } else {
                var s = 0.0;
                for (var j = 0u; j < n; j++) { s += c[b + j]; }
                for (var j = 0u; j < n; j++) { c[b + j] = c[b + j] / (s + eps); }
            }
        }
        // Column step.
        for (var k = 0u; k < n; k++) {
            var s = 0.0;
            for (var r = 0u; r < n; r++) { s += c[r * n + k]; }
            for (var r = 0u; r < n; r++) { c[r * n + k] = c[r * n + k] / (s + eps); }
        }
    }
    for (var i = 0u; i < nn; i++) { coef[cb + i] = c[i]; }
}

// The module is built per shape (hc_streams.wgsl: a thread's stream values in registers).
@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let t = wid.x;
    if (t >= step.ntok) { return; }
    let n = p.n_hc;
    var xr = load_streams(lid, t * N * E);
    let inv = flat_inv_rms(lid, &xr, p.rms_eps);
    if (lid < n) {
        let mb = t * p.nm;
        pre[lid] = sigmoid(mix[mb + lid] * inv * hw[0] + hw[3u + lid]) + p.hc_eps;
        coef[t * (n + n * n) + lid] = 2.0 * sigmoid(mix[mb + n + lid] * inv * hw[1] + hw[3u + n + lid]);
    }
    workgroupBarrier();
    // Collapse into xn (each thread its own columns), then the weighted RMS norm.
    var yr: array<f32, C>;
    let inv2 = collapse(lid, &xr, pre, &yr, p.rms_eps);
    let nb = 3u + p.nm;
    let ob = t * E;
    for (var m = 0u; m < C; m++) {
        let j = lid + m * WG;
        if (j < E) { xn[ob + j] = yr[m] * inv2 * hw[nb + j]; }
    }
    // The exit's comb matrix, off the others' path (they are done).
    if (lid == 0u) { sinkhorn(t, inv); }
}
