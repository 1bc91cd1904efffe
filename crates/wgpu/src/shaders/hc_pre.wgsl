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
var<workgroup> c: array<f32, 64>;   // comb, row-major [r][k]

// The comb matrix, one thread per element (r, k) (n x n <= 64 threads; the others only join the
// barriers). Each thread sums its row or column in index order, as the CPU does, so the result is
// the serial one bit for bit; a single thread running the whole Sinkhorn loop is a long serial chain.

// Row sums (normalise = false: row softmax) of the element's row, then the new value; a barrier
// between reading and writing.
fn row_step(lid: u32, n: u32, eps: f32, softmax: bool) {
    let owns = lid < n * n;
    let r = lid / n;
    var v = 0.0;
    if (owns) {
        v = c[lid];
        if (softmax) {
            var mx = c[r * n];
            for (var k = 1u; k < n; k++) { mx = max(mx, c[r * n + k]); }
            var s = 0.0;
            for (var k = 0u; k < n; k++) { s += exp(c[r * n + k] - mx); }
            v = exp(v - mx) / s + eps;
        } else {
            var s = 0.0;
            for (var k = 0u; k < n; k++) { s += c[r * n + k]; }
            v = v / (s + eps);
        }
    }
    workgroupBarrier();
    if (owns) { c[lid] = v; }
    workgroupBarrier();
}

fn col_step(lid: u32, n: u32, eps: f32) {
    let owns = lid < n * n;
    let k = lid % n;
    var v = 0.0;
    if (owns) {
        var s = 0.0;
        for (var r = 0u; r < n; r++) { s += c[r * n + k]; }
        v = c[lid] / (s + eps);
    }
    workgroupBarrier();
    if (owns) { c[lid] = v; }
    workgroupBarrier();
}

// pre, post and the Sinkhorn matrix of token t from its scaled mix (as hc::pre_from_mix).
fn mix_weights(lid: u32, t: u32, inv: f32) {
    let n = p.n_hc;
    let mb = t * p.nm;
    let cb = t * (n + n * n);
    let eps = p.hc_eps;
    if (lid < n) {
        pre[lid] = sigmoid(mix[mb + lid] * inv * hw[0] + hw[3u + lid]) + eps;
        coef[cb + lid] = 2.0 * sigmoid(mix[mb + n + lid] * inv * hw[1] + hw[3u + n + lid]);
    }
    if (lid < n * n) {
        c[lid] = mix[mb + 2u * n + lid] * inv * hw[2] + hw[3u + 2u * n + lid];
    }
    workgroupBarrier();
    row_step(lid, n, eps, true);
    col_step(lid, n, eps);
    for (var it = 1u; it < p.iters; it++) {
        row_step(lid, n, eps, false);
        col_step(lid, n, eps);
    }
    if (lid < n * n) { coef[cb + n + lid] = c[lid]; }
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let t = wid.x;
    if (t >= step.ntok) { return; }
    let n = p.n_hc;
    let e = p.e;
    let hd = n * e;
    let xb = t * hd;
    var ss = 0.0;
    for (var i = lid; i < hd; i += WG) {
        let v = x[xb + i];
        ss += v * v;
    }
    let inv = 1.0 / sqrt(wg_sum(lid, ss) / f32(hd) + p.rms_eps);
    mix_weights(lid, t, inv);
    // Collapse into xn (each thread keeps its own columns), then the weighted RMS norm.
    let ob = t * e;
    var ss2 = 0.0;
    for (var j = lid; j < e; j += WG) {
        var acc = 0.0;
        for (var s = 0u; s < n; s++) { acc += pre[s] * x[xb + s * e + j]; }
        xn[ob + j] = acc;
        ss2 += acc * acc;
    }
    let inv2 = 1.0 / sqrt(wg_sum(lid, ss2) / f32(e) + p.rms_eps);
    let nb = 3u + p.nm;
    for (var j = lid; j < e; j += WG) {
        xn[ob + j] = xn[ob + j] * inv2 * hw[nb + j];
    }
}
