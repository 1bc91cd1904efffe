// Greedy pick over one row of n logits: the first index of the maximum (NaN and -inf never win),
// the row's log-sum-exp, and the log-probability of the pick (= max - lse), like the CUDA
// `argmax_row`. Two dispatches of this module: phase 0, BLOCKS workgroups of 256, each over its own
// contiguous slice of the row (each thread a running (max, index, sum of exp(x - max)) over a stride,
// then a tree), writing one part per workgroup; phase 1, one workgroup merging the BLOCKS parts by the
// same tree (a fixed order: the result does not depend on timing). An empty part has max = -FLT_MAX and
// index EMPTY (WGSL has no infinity literal; a logit of exactly -FLT_MAX is treated as -inf).
struct Params { n: u32, phase: u32, pad1: u32, pad2: u32 }
struct Out { index: u32, logprob: f32, max: f32, lse: f32 }
struct Part { max: f32, index: u32, sum: f32, pad: u32 }
@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read_write> parts: array<Part, BLOCKS>;
@group(0) @binding(2) var<storage, read_write> out: Out;
@group(0) @binding(3) var<uniform> p: Params;

const WG: u32 = 256u;
const NEG: f32 = -3.4028234663852886e38;
const EMPTY: u32 = 0xffffffffu;
var<workgroup> rv: array<f32, WG>;
var<workgroup> ri: array<u32, WG>;
var<workgroup> rs: array<f32, WG>;

// Merges slot lid + s into slot lid (the larger max wins, the lower index on a tie; sums rescaled).
fn merge(lid: u32, s: u32) {
    let ov = rv[lid + s];
    let oi = ri[lid + s];
    let os = rs[lid + s];
    if (oi == EMPTY) { return; }
    if (ri[lid] == EMPTY) {
        rv[lid] = ov;
        ri[lid] = oi;
        rs[lid] = os;
        return;
    }
    let m = max(rv[lid], ov);
    rs[lid] = rs[lid] * exp(rv[lid] - m) + os * exp(ov - m);
    if (ov > rv[lid] || (ov == rv[lid] && oi < ri[lid])) {
        rv[lid] = ov;
        ri[lid] = oi;
    }
}

fn tree(lid: u32) {
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if (lid < s) { merge(lid, s); }
        workgroupBarrier();
    }
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    if (p.phase == 0u) {
        let per = (p.n + BLOCKS - 1u) / BLOCKS;
        let lo = wid.x * per;
        let hi = min(p.n, lo + per);
        var best = NEG;
        var bi = EMPTY;
        var sum = 0.0;
        for (var j = lo + lid; j < hi; j += WG) {
            let v = x[j];
            if (v > best) {
                sum = select(sum * exp(best - v), 0.0, bi == EMPTY) + 1.0;
                best = v;
                bi = j;
            } else if (v > NEG) {
                sum += exp(v - best);
            }
        }
        rv[lid] = best;
        ri[lid] = bi;
        rs[lid] = sum;
        tree(lid);
        if (lid == 0u) { parts[wid.x] = Part(rv[0], ri[0], rs[0], 0u); }
        return;
    }
    if (lid < BLOCKS) {
        rv[lid] = parts[lid].max;
        ri[lid] = parts[lid].index;
        rs[lid] = parts[lid].sum;
    } else {
        rv[lid] = NEG;
        ri[lid] = EMPTY;
        rs[lid] = 0.0;
    }
    tree(lid);
    if (lid == 0u) {
        let empty = ri[0] == EMPTY;
        let lse = select(rv[0] + log(rs[0]), NEG, empty);
        out.index = select(ri[0], 0u, empty);
        out.max = rv[0];
        out.lse = lse;
        out.logprob = select(-log(rs[0]), 0.0, empty);
    }
}
