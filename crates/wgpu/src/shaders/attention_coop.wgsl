// Prefill attention on cooperative matrices (tensor cores on NVIDIA, simdgroup matrices on Apple):
// the candidates of attention.wgsl (window rows, then all compressed rows or the indexer's picks;
// rows are both K and V, shared by every head: MQA), for steps that do not split. A workgroup
// serves HG = N heads of one token, so per tile of T candidates the work is two products on N x N
// matrices, f16 inputs and f32 sums: S (HG x T) = Q (HG x D) K^T, then O (HG x D) += P (HG x T) V.
// 4 subgroups of 32: subgroup s holds the Q tiles of k-chunks s, s + 4, ... (scores are partial
// sums over its chunks, added through workgroup memory) and accumulates the O tiles of columns
// s, s + 4, ... for the whole step (OWN of each).
// Softmax: the layout of an accumulator is opaque, so a row of O cannot be rescaled in registers.
// Each head keeps a reference m (its sink at first) and P = exp(s - m) in f16: m is raised only
// when a tile's max passes m + TAU (P stays below e^TAU, inside f16), then the O tiles go through
// workgroup memory to be scaled per row (rare: the reference rises by more than TAU each time).
// Every P term is at most e^TAU and the largest is at least 1 (the one that set m), so terms
// rounded to f16 lose 2^-12 relative, and the sums use the rounded P (weights that add to 1).
// Inputs rounded to f16: Q (f32 after norm and RoPE: |q| <= sqrt(D), inside f16's range), rows (the
// FP8-simulated part is exact in f16, the RoPE tail rounds), P. Error ~1e-4 of the output's scale.
// Generated constants: N (the matrix side), T = 2N, OWN = D / N / 4; the lines marked //GEN are
// written out per tile (no arrays of matrices).
struct Params {
    n_head: u32, d: u32, swa: u32, ratio: u32,
    top_k: u32, scale: f32, groups: u32, splits: u32,
    short_step: u32, cap: u32, pad1: u32, pad2: u32,
}
@group(0) @binding(0) var<storage, read> q: array<f32>;
@group(0) @binding(1) var<storage, read> kvn: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> ring: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read> comp: array<vec4<f32>>;
@group(0) @binding(4) var<storage, read> sel: array<u32>;
@group(0) @binding(5) var<storage, read> sinks: array<f32>;
@group(0) @binding(6) var<storage, read_write> o: array<f32>;
@group(0) @binding(7) var<uniform> p: Params;
@group(0) @binding(8) var<uniform> step: Step;

const WG: u32 = 128u;
// Subgroups the tiling assumes (32 invocations each); another count poisons the output (NaN).
const NS: u32 = 4u;
const HG: u32 = N;
const MAXD: u32 = 512u;
// A staged row per thread's vec4 (MAXD / 4 == WG).
const D4: u32 = MAXD / 4u;
// Rows of f16 KS apart: 16-byte aligned for the matrix loads, banks staggered (1040 bytes).
const KS: u32 = MAXD + 8u;
const PS: u32 = T + 8u;
// Threads per head in the softmax step, and the scores each takes.
const TPH: u32 = WG / HG;
const SPT: u32 = T / TPH;
// exp(TAU) must stay well inside f16 (65504 = e^11.09).
const TAU: f32 = 8.0;
const NEG: f32 = -3.4028235e38;
const SRC_RING: u32 = 0u;
const SRC_NEW: u32 = 1u;
const SRC_COMP: u32 = 2u;
const NONE: u32 = 0xffffffffu;

var<workgroup> kt: array<f16, T * KS>;       // the tile's rows [candidate][dim]; first the queries [head][dim]
var<workgroup> sp: array<f32, NS * HG * T>;  // partial scores [subgroup][head][candidate]; O tiles in transit
var<workgroup> pt: array<f16, HG * PS>;      // P [head][candidate]
var<workgroup> zs: array<f32, N * N>;        // zeros: the accumulators' start
var<workgroup> red: array<f32, WG>;
var<workgroup> red2: array<f32, WG>;
var<workgroup> mref: array<f32, HG>;
var<workgroup> lsum: array<f32, HG>;
var<workgroup> alpha: array<f32, HG>;
var<workgroup> rise: atomic<u32>;            // 1: a reference rose in this tile (after the first)
var<workgroup> nsub: u32;

// Candidate c of token t (source in the top 2 bits, row below), NONE past the last.
fn code_of(c: u32, t: u32, sq: Seq, start: u32, n_raw: u32, total: u32, picked: bool) -> u32 {
    if (c >= total) { return NONE; }
    if (c < n_raw) {
        let qp = start + c;
        return select((SRC_NEW << 30u) | (sq.row0 + qp - sq.pos), (SRC_RING << 30u) | (sq.slot * p.swa + qp % p.swa), qp < sq.pos);
    }
    var j = c - n_raw;
    if (picked) { j = sel[t * p.top_k + j]; }
    return (SRC_COMP << 30u) | (sq.slot * p.cap + j);
}

fn row_val(s: u32, i: u32) -> vec4<f32> {
    let kind = s >> 30u;
    let off = (s & 0x3fffffffu) * (p.d / 4u) + i;
    if (kind == SRC_RING) { return ring[off]; }
    if (kind == SRC_NEW) { return kvn[off]; }
    return comp[off];
}

fn put4(at: u32, v: vec4<f32>) {
    kt[at] = f16(v.x);
    kt[at + 1u] = f16(v.y);
    kt[at + 2u] = f16(v.z);
    kt[at + 3u] = f16(v.w);
}

// Rows of candidates base .. base + T into kt as f16, zero past the last candidate and past d (so
// the products may run over MAXD). Thread lid takes vec4 lid of every row (coalesced).
fn stage_rows(lid: u32, base: u32, t: u32, sq: Seq, start: u32, n_raw: u32, total: u32, picked: bool) {
    for (var c = 0u; c < T; c++) {
        let code = code_of(base + c, t, sq, start, n_raw, total, picked);
        var v = vec4<f32>(0.0);
        if (code != NONE && lid < p.d / 4u) { v = row_val(code, lid); }
        put4(c * KS + 4u * lid, v);
    }
}

// Every element of the O tiles in transit (sp, N x N per subgroup, row-major) times its head's alpha.
fn scale_transit(lid: u32) {
    workgroupBarrier();
    for (var e = lid; e < NS * N * N; e += WG) { sp[e] *= alpha[(e % (N * N)) / N]; }
    workgroupBarrier();
}

// The O tiles in transit of round j (subgroup b's tile is column tile b + j * NS) divided by their
// head's sum, written to o.
fn write_transit(lid: u32, j: u32, t: u32, h0: u32, nhg: u32) {
    workgroupBarrier();
    for (var e = lid; e < NS * N * N; e += WG) {
        let m = (e % (N * N)) / N;
        let col = (e / (N * N) + j * NS) * N + e % N;
        if (m < nhg && col < p.d) { o[(t * p.n_head + h0 + m) * p.d + col] = sp[e] / lsum[m]; }
    }
    workgroupBarrier();
}

@compute @workgroup_size(128)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32, @builtin(subgroup_id) sg: u32, @builtin(num_subgroups) nsg: u32) {
    let g = wid.x;
    let t = wid.y;
    if (t >= step.ntok) { return; }
    let d = p.d;
    let h0 = g * HG;
    let nhg = min(HG, p.n_head - h0);
    if (lid == 0u) { nsub = nsg; }
    if (workgroupUniformLoad(&nsub) != NS) {
        for (var e = lid; e < nhg * d; e += WG) { o[(t * p.n_head + h0) * d + e] = bitcast<f32>(0x7fc00000u); }
        return;
    }
    // The group's queries, f16, zero past d and for heads past n_head; softmax state from the sinks.
    for (var m = 0u; m < HG; m++) {
        var v = vec4<f32>(0.0);
        if (m < nhg && lid < d / 4u) {
            let b = (t * p.n_head + h0 + m) * d + 4u * lid;
            v = vec4<f32>(q[b], q[b + 1u], q[b + 2u], q[b + 3u]);
        }
        put4(m * KS + 4u * lid, v);
    }
    for (var e = lid; e < N * N; e += WG) { zs[e] = 0.0; }
    if (lid < HG) {
        mref[lid] = select(0.0, sinks[min(h0 + lid, p.n_head - 1u)], lid < nhg);
        lsum[lid] = 1.0;
    }
    workgroupBarrier();
//GEN_Q
//GEN_ACC
    workgroupBarrier();

    let sq = seq_of(t);
    let pos = sq.pos + t - sq.row0;
    let start = select(0u, pos + 1u - p.swa, pos + 1u >= p.swa);
    let n_raw = pos + 1u - start;
    var nc = 0u;
    if (p.ratio != 0u) { nc = (pos + 1u) / p.ratio; }
    let picked = p.top_k != 0u && nc > p.top_k;
    let total = n_raw + select(nc, p.top_k, picked);
    let m = lid / TPH;
    let r = lid % TPH;

    for (var base = 0u; base < total; base += T) {
        stage_rows(lid, base, t, sq, start, n_raw, total, picked);
        workgroupBarrier();
        // (The last read of the flag was before the previous tile's last barrier.)
        if (lid == 0u) { atomicStore(&rise, 0u); }
        // This subgroup's partial scores over its k-chunks.
//GEN_S
        workgroupBarrier();
        // Thread (m, r) adds the partials of candidates r * SPT .. of head m.
        var sv: array<f32, SPT>;
        var mx = NEG;
        for (var k = 0u; k < SPT; k++) {
            let n = r * SPT + k;
            var s = 0.0;
            for (var b = 0u; b < NS; b++) { s += sp[(b * HG + m) * T + n]; }
            sv[k] = select(NEG, s * p.scale, base + n < total);
            mx = max(mx, sv[k]);
        }
        red[lid] = mx;
        workgroupBarrier();
        var mt = NEG;
        for (var k = 0u; k < TPH; k++) { mt = max(mt, red[m * TPH + k]); }
        let mold = mref[m];
        let mnew = select(mold, mt, mt > mold + TAU);
        var ps = 0.0;
        for (var k = 0u; k < SPT; k++) {
            let ph = f16(exp(sv[k] - mnew));
            pt[m * PS + r * SPT + k] = ph;
            ps += f32(ph);
        }
        red2[lid] = ps;
        workgroupBarrier();
        if (r == 0u) {
            var tot = 0.0;
            for (var k = 0u; k < TPH; k++) { tot += red2[m * TPH + k]; }
            let a = exp(mold - mnew);
            alpha[m] = a;
            lsum[m] = lsum[m] * a + tot;
            mref[m] = mnew;
            // Before the first tile's products the accumulators are zero: nothing to rescale.
            if (mnew != mold && base != 0u) { atomicStore(&rise, 1u); }
        }
        // A reference rose: rescale O (the flag is read uniformly: the branch holds barriers).
        if (workgroupUniformLoad(&rise) != 0u) {
//GEN_RESCALE
        }
        // O += P V over this tile.
//GEN_PV
        workgroupBarrier();
    }
//GEN_WRITE
}
