// Routed-expert products: y[slot][r] = W_id[r] . x[slot / x_div] for every (token, slot) of the step,
// id = ids[slot], W_id = rows [id * r_exp, (id + 1) * r_exp) of a stacked expert tensor. One dispatch
// per binding part (Params.y_off = the part's first global row): a workgroup whose row lies in another
// part returns at once, so an expert may straddle parts. One workgroup of 64 per (row, slot).
struct Expert {
    k: u32,         // slots per token
    x_div: u32,     // slots per activation row (k: rows of xn; 1: one row per slot)
    r_exp: u32,     // rows per expert (output row stride)
    pad: u32,
}
@group(0) @binding(5) var<uniform> ex: Expert;
@group(0) @binding(6) var<storage, read> ids: array<u32>;

const WG: u32 = 64u;
var<workgroup> red: array<f32, 256>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32 SG_PARAMS) {
    load_prelude(lid);
    let r = wid.x + wid.y * p.wg_x;
    let slot = wid.z;
    if (r >= ex.r_exp || slot >= step.ntok * ex.k) { return; }
    let g = ids[slot] * ex.r_exp + r;
    if (g < p.y_off || g - p.y_off >= p.rows) { return; }
    let rb = p.w_off + (g - p.y_off) * p.row_bytes;
    let xr = (slot / ex.x_div) * p.x_stride4;
    let nchunks = p.cols / 8u;
    var acc: array<f32, TB>;
    for (var c = lid; c < nchunks; c += WG) {
        let wv = load8(rb, c);
        let xi = xr + 2u * c;
        acc[0] += dot(wv.a, x[xi]) + dot(wv.b, x[xi + 1u]);
    }
    REDUCE_CALL
    if (lid == 0u) {
        y[slot * ex.r_exp + r] = red[0];
    }
}
