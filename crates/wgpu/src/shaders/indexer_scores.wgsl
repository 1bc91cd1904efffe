// Indexer relevance of compressed row c for token t (ds4_model::attention::indexer_scores):
// sum over heads h of (w[t][h] * wscale) * relu(q[t][h] . key[c]), for tokens that see more than
// top_k compressed rows (nc = (pos + t + 1) / ratio > top_k; the others attend to all rows).
// A workgroup takes CW candidates, HT threads each: thread j computes the heads j, j + HT, ... of its
// candidate (each head's dot summed as before), then one thread per candidate adds the heads' terms
// in head order, as the CPU does. Each row reads its own sequence's keys (seq.wgsl; slot s: rows
// s * stride .., stride = the capacity) at its own position.
struct Params { heads: u32, dim: u32, ratio: u32, top_k: u32, stride: u32, wscale: f32, wg_x: u32, pad: u32 }
@group(0) @binding(0) var<storage, read> iq: array<f32>;
@group(0) @binding(1) var<storage, read> iw: array<f32>;
@group(0) @binding(2) var<storage, read> keys: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> scores: array<f32>;
@group(0) @binding(4) var<uniform> p: Params;
@group(0) @binding(5) var<uniform> step: Step;

const WG: u32 = 256u;
const CW: u32 = 16u;
const HT: u32 = WG / CW;
const MAXH: u32 = 128u;
var<workgroup> terms: array<f32, 2048>;  // CW x MAXH

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let t = wid.y;
    if (t >= step.ntok) { return; }
    let nc = (row_pos(t) + 1u) / p.ratio;
    let kb = seq_of(t).slot * p.stride;
    if (nc <= p.top_k || wid.x * CW >= nc) { return; }
    let cl = lid / HT;
    let c = wid.x * CW + cl;
    let live = c < nc;
    let d4 = p.dim / 4u;
    if (live) {
        for (var h = lid % HT; h < p.heads; h += HT) {
            let qb = (t * p.heads + h) * p.dim;
            var dot4 = vec4<f32>(0.0);
            for (var i = 0u; i < d4; i++) {
                let q = vec4<f32>(iq[qb + 4u * i], iq[qb + 4u * i + 1u], iq[qb + 4u * i + 2u], iq[qb + 4u * i + 3u]);
                dot4 += q * keys[(kb + c) * d4 + i];
            }
            let dk = (dot4.x + dot4.y) + (dot4.z + dot4.w);
            // A head with a non-positive dot adds nothing (adding +0.0 leaves the sum exactly).
            terms[cl * MAXH + h] = select(0.0, (iw[t * p.heads + h] * p.wscale) * dk, dk > 0.0);
        }
    }
    workgroupBarrier();
    if (live && lid % HT == 0u) {
        var s = 0.0;
        for (var h = 0u; h < p.heads; h++) { s += terms[cl * MAXH + h]; }
        scores[t * p.stride + c] = s;
    }
}
