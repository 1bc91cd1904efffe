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
var<workgroup> key: array<f32, MAX_EXPERT>;    // p(e) + bias[e]: what the choice ranks
var<workgroup> sel: array<u32, MAX_K>;         // the picks in selection order

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

// Expert e's place in the choice: the experts ahead of it (a greater key, or an equal key and a
// lower index), counted only up to k (from there on e is not picked). Every thread ranks its own
// experts against all n keys in workgroup memory, so the k picks need one barrier instead of k
// rounds of a tree argmax; the picks are exactly the serial selection's, in its order. (A NaN key
// breaks the order: the picks are then undefined, but stay expert ids, as `sel` starts zeroed.)
fn rank(e: u32, ne: u32, k: u32) -> u32 {
    let v = key[e];
    var ahead = 0u;
    for (var j = 0u; j < e && ahead < k; j++) { ahead += u32(key[j] >= v); }
    for (var j = e + 1u; j < ne && ahead < k; j++) { ahead += u32(key[j] > v); }
    return ahead;
}

// Slot s (< k) of token t: its weight (the sum over the picks in selection order, as the CPU) and
// its place among the k ids in ascending order (equal ids, possible in a hash row, keep their
// selection order), so no thread has to sort.
fn write_slot(t: u32, s: u32, k: u32, zero: bool) {
    let id = sel[s];
    var sum = 0.0;
    var at = 0u;
    for (var j = 0u; j < k; j++) {
        let o = sel[j];
        sum += score[o];
        at += u32(o < id || (o == id && j < s));
    }
    let denom = select(1.0, max(sum, 6.1035156e-5), p.normalize != 0u);
    ids[t * k + at] = id;
    wts[t * k + at] = select(score[id] / denom * p.scale, 0.0, zero);
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let t = wid.x;
    if (t >= step.ntok) { return; }
    let ne = p.n_expert;
    let k = p.k;
    for (var e = lid; e < ne; e += WG) {
        let v = sqrt(softplus(logits[t * ne + e]));
        score[e] = v;
        key[e] = v;
        if (p.has_bias != 0u) { key[e] = v + bias[e]; }
    }
    let token = tok[t];
    let unknown = p.hash != 0u && token >= p.n_vocab;
    if (p.hash != 0u && lid < k) {
        var e = 0u;
        if (!unknown) { e = tid2eid[token * k + lid]; }  // not `select`: it would read past the table
        sel[lid] = e;
    }
    workgroupBarrier();
    if (p.hash == 0u) {
        for (var e = lid; e < ne; e += WG) {
            let at = rank(e, ne, k);
            if (at < k) { sel[at] = e; }
        }
        workgroupBarrier();
    }
    if (lid < k) { write_slot(t, lid, k, unknown); }
}
