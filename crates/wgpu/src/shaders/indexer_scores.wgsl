// Indexer relevance of compressed row c for token t (ds4_model::attention::indexer_scores):
// sum over heads h of (w[t][h] * wscale) * relu(q[t][h] . key[c]), for tokens that see more than
// top_k compressed rows (nc = (pos + t + 1) / ratio > top_k; the others attend to all rows).
// One thread per candidate; 16 heads' queries at a time are staged in workgroup memory, so a key
// row is read once per 16 heads. Each row reads its own sequence's keys (seq.wgsl; slot s: rows
// s * stride .., stride = the capacity) at its own position.
struct Params { heads: u32, dim: u32, ratio: u32, top_k: u32, stride: u32, wscale: f32, wg_x: u32, pad: u32 }
@group(0) @binding(0) var<storage, read> iq: array<f32>;
@group(0) @binding(1) var<storage, read> iw: array<f32>;
@group(0) @binding(2) var<storage, read> keys: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> scores: array<f32>;
@group(0) @binding(4) var<uniform> p: Params;
@group(0) @binding(5) var<uniform> step: Step;

const WG: u32 = 64u;
const MAXD: u32 = 256u;
// Heads staged at once: a key row is read once per block of HB heads.
const HB: u32 = 16u;
var<workgroup> qh: array<vec4<f32>, 1024>;  // HB x MAXD / 4

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let t = wid.y;
    if (t >= step.ntok) { return; }
    let nc = (row_pos(t) + 1u) / p.ratio;
    let kb = seq_of(t).slot * p.stride;
    if (nc <= p.top_k || wid.x * WG >= nc) { return; }
    let c = wid.x * WG + lid;
    let live = c < nc;
    let dim = p.dim;
    let d4 = dim / 4u;
    var s = 0.0;
    for (var h0 = 0u; h0 < p.heads; h0 += HB) {
        let nh = min(HB, p.heads - h0);
        workgroupBarrier();
        for (var k = 0u; k < nh; k++) {
            let qb = (t * p.heads + h0 + k) * dim;
            for (var i = lid; i < d4; i += WG) {
                qh[k * (MAXD / 4u) + i] = vec4<f32>(iq[qb + 4u * i], iq[qb + 4u * i + 1u], iq[qb + 4u * i + 2u], iq[qb + 4u * i + 3u]);
            }
        }
        workgroupBarrier();
        if (live) {
            var dots: array<vec4<f32>, HB>;
            for (var i = 0u; i < d4; i++) {
                let kv = keys[(kb + c) * d4 + i];
                for (var k = 0u; k < HB; k++) { dots[k] += qh[k * (MAXD / 4u) + i] * kv; }
            }
            // Heads in order, as the CPU sums them.
            for (var k = 0u; k < nh; k++) {
                let dk = (dots[k].x + dots[k].y) + (dots[k].z + dots[k].w);
                if (dk > 0.0) { s += (iw[t * p.heads + h0 + k] * p.wscale) * dk; }
            }
        }
    }
    if (live) { scores[t * p.stride + c] = s; }
}
