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
var<workgroup> c: array<f32, 128>;  // the comb matrix, row-major [r][k], in two halves (at 0 and 64)

// The Sinkhorn loop, one thread per comb element (r, k) (n x n <= 64 threads; the others only join
// the barriers). Each thread sums its row or column in index order, as the CPU does, so the result
// is the serial one bit for bit. A step reads one half of `c` and writes the other, so it needs one
// barrier (before its writes are read) instead of a pair. (Fusing a row and a column step, each
// thread summing every row of its column, would halve the barriers again but added about 4 ms per
// entry on lavapipe, the CI adapter.)

// The row step at element lid of the half at `src`: the row softmax + eps (first), or the
// normalisation by the row sum.
fn row_value(src: u32, n: u32, lid: u32, eps: f32, softmax: bool) -> f32 {
    let b = src + (lid / n) * n;
    let v = c[src + lid];
    if (softmax) {
        var mx = c[b];
        for (var j = 1u; j < n; j++) { mx = max(mx, c[b + j]); }
        var s = 0.0;
        for (var j = 0u; j < n; j++) { s += exp(c[b + j] - mx); }
        return exp(v - mx) / s + eps;
    }
    var s = 0.0;
    for (var j = 0u; j < n; j++) { s += c[b + j]; }
    return v / (s + eps);
}

// The column step at element lid of the half at `src`.
fn col_value(src: u32, n: u32, lid: u32, eps: f32) -> f32 {
    let k = lid % n;
    var s = 0.0;
    for (var r = 0u; r < n; r++) { s += c[src + r * n + k]; }
    return c[src + lid] / (s + eps);
}

// Writes the owners' new values into the other half once every thread has read `src`; returns it.
fn publish(lid: u32, owns: bool, v: f32, src: u32) -> u32 {
    let dst = 64u - src;
    if (owns) { c[dst + lid] = v; }
    workgroupBarrier();
    return dst;
}

// pre, post and the Sinkhorn matrix of token t from its scaled mix (as hc::pre_from_mix).
fn mix_weights(lid: u32, t: u32, inv: f32) {
    let n = p.n_hc;
    let mb = t * p.nm;
    let cb = t * (n + n * n);
    let eps = p.hc_eps;
    let owns = lid < n * n;
    if (lid < n) {
        pre[lid] = sigmoid(mix[mb + lid] * inv * hw[0] + hw[3u + lid]) + eps;
        coef[cb + lid] = 2.0 * sigmoid(mix[mb + n + lid] * inv * hw[1] + hw[3u + n + lid]);
    }
    if (owns) {
        c[lid] = mix[mb + 2u * n + lid] * inv * hw[2] + hw[3u + 2u * n + lid];
    }
    workgroupBarrier();
    var v = 0.0;
    if (owns) { v = row_value(0u, n, lid, eps, true); }
    var src = publish(lid, owns, v, 0u);
    if (owns) { v = col_value(src, n, lid, eps); }
    for (var it = 1u; it < p.iters; it++) {
        src = publish(lid, owns, v, src);
        if (owns) { v = row_value(src, n, lid, eps, false); }
        src = publish(lid, owns, v, src);
        if (owns) { v = col_value(src, n, lid, eps); }
    }
    if (owns) { coef[cb + n + lid] = v; }
}

// The module is built per shape (hc_streams.wgsl: a thread's stream values in registers).
@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let t = wid.x;
    if (t >= step.ntok) { return; }
    var xr = load_streams(lid, t * N * E);
    let inv = flat_inv_rms(lid, &xr, p.rms_eps);
    mix_weights(lid, t, inv);
    // Collapse into xn (each thread its own columns), then the weighted RMS norm.
    var yr: array<f32, C>;
    let inv2 = collapse(lid, &xr, pre, &yr, p.rms_eps);
    let nb = 3u + p.nm;
    let ob = t * E;
    for (var m = 0u; m < C; m++) {
        let j = lid + m * WG;
        if (j < E) { xn[ob + j] = yr[m] * inv2 * hw[nb + j]; }
    }
}
