// Sub-layer entry of the hyper-connections, one workgroup per token (ds4_model::hc + the sub-layer
// norm): mix = (hc_fn . X) / rms(X) (the projection of the raw streams is done before, by a mat-vec:
// the flat RMS factor commutes with it), pre/post weights and the Sinkhorn-balanced comb matrix from
// mix * scale + base, then xn = rms_norm(sum_s pre[s] X[s]) * norm. post and comb go to `coef` for
// the sub-layer exit.
//
// The one workgroup was bound by load latency (a load round trip per 256 floats), so every load the
// entry needs (the streams, its mix values, the norm weights) is issued at the start, and the
// streams stay in registers for the collapse: one round trip, then barriers and arithmetic. Each
// thread owns the floats lid + q * WG of every stream, from its loads to its stores of xn.
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

@group(0) @binding(0) var<storage, read> x: array<f32>;        // ntok x n_hc x e
@group(0) @binding(1) var<storage, read> mix: array<f32>;      // ntok x nm (raw projections)
@group(0) @binding(2) var<storage, read_write> xn: array<f32>; // ntok x e
@group(0) @binding(3) var<storage, read_write> coef: array<f32>; // ntok x (n_hc + n_hc^2): post, comb
@group(0) @binding(4) var<storage, read> hw: array<f32>;       // scale[3], base[nm], norm[e]
@group(0) @binding(5) var<uniform> p: Params;
@group(0) @binding(6) var<uniform> step: Step;

const MAX_HC: u32 = 8u;
// Streams and floats a stream a thread holds in registers: Flash (4 x 4096) takes 16 floats, Pro
// (4 x 7168) 28. Larger shapes read the streams twice from storage (`entry_loads`).
const SREG: u32 = 4u;
const QREG: u32 = 32u;
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

// Thread lid's share of the mix terms, loaded before the streams' reduction needs them: the raw
// projections (pre, post: lid < n; comb: lid < n * n), their bases, and the three scales.
struct MixIn {
    m: vec3<f32>,
    b: vec3<f32>,
    s: vec3<f32>,
}

fn load_mix(lid: u32, t: u32) -> MixIn {
    let n = p.n_hc;
    let mb = t * p.nm;
    var r: MixIn;
    r.s = vec3<f32>(hw[0], hw[1], hw[2]);
    if (lid < n) {
        r.m.x = mix[mb + lid];
        r.m.y = mix[mb + n + lid];
        r.b.x = hw[3u + lid];
        r.b.y = hw[3u + n + lid];
    }
    if (lid < n * n) {
        r.m.z = mix[mb + 2u * n + lid];
        r.b.z = hw[3u + 2u * n + lid];
    }
    return r;
}

// pre, post and the Sinkhorn matrix of token t from its scaled mix (as hc::pre_from_mix).
fn mix_weights(lid: u32, t: u32, inv: f32, mi: MixIn) {
    let n = p.n_hc;
    let cb = t * (n + n * n);
    let eps = p.hc_eps;
    let owns = lid < n * n;
    if (lid < n) {
        pre[lid] = sigmoid(mi.m.x * inv * mi.s.x + mi.b.x) + eps;
        coef[cb + lid] = 2.0 * sigmoid(mi.m.y * inv * mi.s.y + mi.b.y);
    }
    if (owns) {
        c[lid] = mi.m.z * inv * mi.s.z + mi.b.z;
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

// n <= SREG streams of e <= QREG * WG floats: the streams and norm weights in registers. Thread lid
// owns the floats lid + q * WG of each stream, as the scalar kernel did, so each sum takes the same
// terms in the same order (for widths a multiple of WG; vec4 columns, another order, moved a tiny
// q4 stage test's logits by 9.5e-5 of the largest, over its bound). Every array index is a loop
// counter of a constant-bound loop, so the arrays can stay in registers; the loads are all issued
// before the first sum.
fn entry_regs(lid: u32, t: u32, mi: MixIn) {
    let n = p.n_hc;
    let e = p.e;
    let xb = t * n * e;
    var xv: array<f32, 128>;  // SREG x QREG: [s * QREG + q] = stream s, float lid + q * WG
    var nw: array<f32, QREG>;
    let nb = 3u + p.nm;
    for (var k = 0u; k < SREG * QREG; k++) {
        let s = k / QREG;
        let j = lid + (k % QREG) * WG;
        if (s < n && j < e) { xv[k] = x[xb + s * e + j]; }
    }
    for (var q = 0u; q < QREG; q++) {
        let j = lid + q * WG;
        if (j < e) { nw[q] = hw[nb + j]; }
    }
    // In the scalar kernel's order (stream-major, then float); entries past the shape stay zero
    // (WGSL zero-initialises) and add nothing.
    var ss = 0.0;
    for (var k = 0u; k < SREG * QREG; k++) { ss += xv[k] * xv[k]; }
    let inv = 1.0 / sqrt(wg_sum(lid, ss) / f32(n * e) + p.rms_eps);
    mix_weights(lid, t, inv, mi);
    var w: array<f32, SREG>;
    for (var s = 0u; s < SREG; s++) {
        if (s < n) { w[s] = pre[s]; }
    }
    // Collapse in stream order from 0 (as the CPU), over stream 0's registers.
    var ss2 = 0.0;
    for (var q = 0u; q < QREG; q++) {
        var a = 0.0;
        for (var s = 0u; s < SREG; s++) {
            if (s < n) { a += w[s] * xv[s * QREG + q]; }
        }
        xv[q] = a;
        ss2 += a * a;
    }
    let inv2 = 1.0 / sqrt(wg_sum(lid, ss2) / f32(e) + p.rms_eps);
    let ob = t * e;
    for (var q = 0u; q < QREG; q++) {
        let j = lid + q * WG;
        if (j < e) { xn[ob + j] = xv[q] * inv2 * nw[q]; }
    }
}

// Any other shape (the scalar kernel): the streams are read twice from storage; xn is written,
// then read back and scaled by the thread that wrote each float.
fn entry_loads(lid: u32, t: u32, mi: MixIn) {
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
    mix_weights(lid, t, inv, mi);
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

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let t = wid.x;
    if (t >= step.ntok) { return; }
    let mi = load_mix(lid, t);
    if (p.n_hc <= SREG && p.e <= QREG * WG) {
        entry_regs(lid, t, mi);
    } else {
        entry_loads(lid, t, mi);
    }
}
