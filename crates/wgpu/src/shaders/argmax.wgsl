// Greedy pick over one row of n logits: the first index of the maximum (NaN and -inf never win),
// the row's log-sum-exp, and the log-probability of the pick (= max - lse), like the CUDA
// `argmax_row`. One workgroup of 256: each thread keeps a running (max, index, sum of exp(x - max))
// over a stride, then a tree merges the parts. An empty part has max = -FLT_MAX and index EMPTY
// (WGSL has no infinity literal; a logit of exactly -FLT_MAX is treated as -inf).
struct Params { n: u32, pad0: u32, pad1: u32, pad2: u32 }
struct Out { index: u32, logprob: f32, max: f32, lse: f32 }
@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read_write> out: Out;
@group(0) @binding(2) var<uniform> p: Params;

const WG: u32 = 256u;
const NEG: f32 = -3.4028234663852886e38;
const EMPTY: u32 = 0xffffffffu;
var<workgroup> rv: array<f32, WG>;
var<workgroup> ri: array<u32, WG>;
var<workgroup> rs: array<f32, WG>;

@compute @workgroup_size(256)
fn main(@builtin(local_invocation_index) lid: u32) {
    var best = NEG;
    var bi = EMPTY;
    var sum = 0.0;
    for (var j = lid; j < p.n; j += WG) {
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
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if (lid < s) {
            let ov = rv[lid + s];
            let oi = ri[lid + s];
            let os = rs[lid + s];
            if (oi != EMPTY) {
                if (ri[lid] == EMPTY) {
                    rv[lid] = ov;
                    ri[lid] = oi;
                    rs[lid] = os;
                } else {
                    let m = max(rv[lid], ov);
                    rs[lid] = rs[lid] * exp(rv[lid] - m) + os * exp(ov - m);
                    if (ov > rv[lid] || (ov == rv[lid] && oi < ri[lid])) {
                        rv[lid] = ov;
                        ri[lid] = oi;
                    }
                }
            }
        }
        workgroupBarrier();
    }
    if (lid == 0u) {
        let empty = ri[0] == EMPTY;
        let lse = select(rv[0] + log(rs[0]), NEG, empty);
        out.index = select(ri[0], 0u, empty);
        out.max = rv[0];
        out.lse = lse;
        out.logprob = select(-log(rs[0]), 0.0, empty);
    }
}
