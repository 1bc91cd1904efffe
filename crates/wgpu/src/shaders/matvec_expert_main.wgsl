// Routed-expert products: y[slot][r] = W_id[r] . x[slot / x_div] for every (token, slot) of the step,
// id = ids[slot], W_id = rows [id * r_exp, (id + 1) * r_exp) of a stacked expert tensor. One dispatch
// per binding part (Params.y_off = the part's first global row): a row that lies in another part is
// skipped, so an expert may straddle parts. One workgroup of SEG x RW threads per (RW rows, slot): row
// r0 + lid / SEG is summed by its segment of SEG threads, thread lid % SEG taking chunks lid % SEG,
// + SEG, ... (as a thread of the grouped kernel does); each thread's partial goes to its row's sum and
// zeros to the others', so the workgroup reduction sums every row exactly as the grouped kernel's
// SEG-thread reduction does (x + 0 = x), and decode rows equal prefill rows bit for bit. A thread walks
// one row (not RW of them): a quarter of the serial loads.
struct Expert {
    k: u32,         // slots per token
    x_div: u32,     // slots per activation row (k: rows of xn; 1: one row per slot)
    r_exp: u32,     // rows per expert (output row stride)
    pad: u32,
}
@group(0) @binding(5) var<uniform> ex: Expert;
@group(0) @binding(6) var<storage, read> ids: array<u32>;

const SEG: u32 = 64u;
const WG: u32 = SEG * RW;
var<workgroup> red: array<f32, WG * NO>;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32 SG_PARAMS) {
    load_prelude(lid);
    let r0 = (wid.x + wid.y * p.wg_x) * RW;
    let slot = wid.z;
    if (r0 >= ex.r_exp || slot >= step.ntok * ex.k) { return; }
    let g0 = ids[slot] * ex.r_exp + r0;
    let nr = min(RW, ex.r_exp - r0);
    let xr = (slot / ex.x_div) * p.x_stride4;
    let nchunks = p.cols / 8u;
    let r = lid / SEG;
    let g = g0 + r;
    var s = 0.0;
    if (r < nr && g >= p.y_off && g - p.y_off < p.rows) {
        let rb = p.w_off + (g - p.y_off) * p.row_bytes;
        for (var c = lid % SEG; c < nchunks; c += SEG) {
            let wv = load8(rb, c);
            let xi = xr + 2u * c;
            s += dot(wv.a, x[xi]) + dot(wv.b, x[xi + 1u]);
        }
    }
    var acc: array<f32, NO>;
    for (var o = 0u; o < NO; o++) { acc[o] = select(0.0, s, o == r); }
    REDUCE_CALL
    if (lid < nr) {
        let g = g0 + lid;
        if (g >= p.y_off && g - p.y_off < p.rows) {
            y[slot * ex.r_exp + r0 + lid] = red[lid * WG];
        }
    }
}
