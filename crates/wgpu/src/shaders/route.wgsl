// MoE routing of one token per workgroup (ds4_model::moe::route): scores p(e) = sqrt(softplus(logit)),
// the k best of p(e) + bias[e] (ties to the lowest index) or the token's row of the hash table,
// weights p(id) / max(sum, 2^-14) (when normalising) * scale. The k slots are written in ascending
// expert id (the order the CPU adds expert outputs), each with its weight; the weight sum runs in
// selection order, as on the CPU. A hash-routed token id outside the table gets expert 0, weight 0.
struct Params {
    n_expert: u32,
    k: u32,
    normalize: u32,
    scale: f32,
    has_bias: u32,
    hash: u32,
    n_vocab: u32,
    pad: u32,
}
struct Step { ntok: u32, pos: u32, pad0: u32, pad1: u32 }

@group(0) @binding(0) var<storage, read> logits: array<f32>;    // ntok x n_expert
@group(0) @binding(1) var<storage, read> bias: array<f32>;      // n_expert
@group(0) @binding(2) var<storage, read> tid2eid: array<u32>;   // n_vocab x k
@group(0) @binding(3) var<storage, read> tok: array<u32>;       // ntok
@group(0) @binding(4) var<storage, read_write> ids: array<u32>; // ntok x k
@group(0) @binding(5) var<storage, read_write> wts: array<f32>; // ntok x k
@group(0) @binding(6) var<uniform> p: Params;
@group(0) @binding(7) var<uniform> step: Step;

const WG: u32 = 256u;
const MAX_EXPERT: u32 = 1024u;
const MAX_K: u32 = 16u;
var<workgroup> score: array<f32, MAX_EXPERT>;  // p(e)
var<workgroup> taken: array<u32, 32>;          // bit e: already selected
var<workgroup> rs: array<f32, WG>;
var<workgroup> ri: array<u32, WG>;
var<workgroup> sel: array<u32, MAX_K>;

// log(1 + u) for 0 <= u <= 1 as 2 atanh(u / (2 + u)) (|z| <= 1/3, 9 terms: < 1e-8 relative),
// independent of the platform's log accuracy near 1.
fn log1p_small(u: f32) -> f32 {
    let z = u / (2.0 + u);
    let z2 = z * z;
    var s = 1.0 / 17.0;
    s = s * z2 + 1.0 / 15.0;
    s = s * z2 + 1.0 / 13.0;
    s = s * z2 + 1.0 / 11.0;
    s = s * z2 + 1.0 / 9.0;
    s = s * z2 + 1.0 / 7.0;
    s = s * z2 + 1.0 / 5.0;
    s = s * z2 + 1.0 / 3.0;
    s = s * z2 + 1.0;
    return 2.0 * z * s;
}

// log(1 + e^v) = max(v, 0) + log1p(e^-|v|).
fn softplus(v: f32) -> f32 {
    return max(v, 0.0) + log1p_small(exp(-abs(v)));
}

// Whether candidate (sa, ia) beats (sb, ib): valid, strictly greater, ties to the lower index.
fn better(sa: f32, ia: u32, sb: f32, ib: u32) -> bool {
    if (ia == 0xffffffffu) { return false; }
    if (ib == 0xffffffffu) { return true; }
    return sa > sb || (sa == sb && ia < ib);
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let t = wid.x;
    if (t >= step.ntok) { return; }
    let ne = p.n_expert;
    let k = p.k;
    for (var e = lid; e < ne; e += WG) { score[e] = sqrt(softplus(logits[t * ne + e])); }
    if (lid < 32u) { taken[lid] = 0u; }
    workgroupBarrier();
    if (p.hash != 0u) {
        if (lid == 0u) {
            let id = tok[t];
            for (var s = 0u; s < k; s++) { sel[s] = select(0u, tid2eid[id * k + s], id < p.n_vocab); }
        }
    } else {
        for (var s = 0u; s < k; s++) {
            var bs = 0.0;
            var bi = 0xffffffffu;
            for (var e = lid; e < ne; e += WG) {
                if ((taken[e >> 5u] & (1u << (e & 31u))) != 0u) { continue; }
                var v = score[e];
                if (p.has_bias != 0u) { v += bias[e]; }
                if (better(v, e, bs, bi)) { bs = v; bi = e; }
            }
            rs[lid] = bs;
            ri[lid] = bi;
            workgroupBarrier();
            for (var h = WG / 2u; h > 0u; h >>= 1u) {
                if (lid < h && better(rs[lid + h], ri[lid + h], rs[lid], ri[lid])) {
                    rs[lid] = rs[lid + h];
                    ri[lid] = ri[lid + h];
                }
                workgroupBarrier();
            }
            if (lid == 0u) {
                let b = ri[0];
                sel[s] = b;
                taken[b >> 5u] |= 1u << (b & 31u);
            }
            workgroupBarrier();
        }
    }
    if (lid != 0u) { return; }
    var w: array<f32, MAX_K>;
    var sum = 0.0;
    for (var s = 0u; s < k; s++) {
        w[s] = score[sel[s]];
        sum += w[s];
    }
    let denom = select(1.0, max(sum, 6.1035156e-5), p.normalize != 0u);
    var id_s: array<u32, MAX_K>;
    for (var s = 0u; s < k; s++) {
        w[s] = w[s] / denom * p.scale;
        id_s[s] = sel[s];
    }
    if (p.hash != 0u && tok[t] >= p.n_vocab) {
        for (var s = 0u; s < k; s++) { w[s] = 0.0; }
    }
    // Insertion sort of the slots by expert id (stable: equal ids keep their selection order).
    for (var s = 1u; s < k; s++) {
        let ci = id_s[s];
        let cw = w[s];
        var j = s;
        while (j > 0u && id_s[j - 1u] > ci) {
            id_s[j] = id_s[j - 1u];
            w[j] = w[j - 1u];
            j--;
        }
        id_s[j] = ci;
        w[j] = cw;
    }
    for (var s = 0u; s < k; s++) {
        ids[t * k + s] = id_s[s];
        wts[t * k + s] = w[s];
    }
}
