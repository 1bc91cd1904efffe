// Routed-expert products for a prefill batch: like matvec_expert_main, but a workgroup takes a tile
// of up to TB slots that chose the same expert (from expert_groups), so each weight chunk is
// dequantized once per tile. y[slot][r] = W_id[r] . x[slot / x_div].

const WG: u32 = 64u;
var<workgroup> red: array<f32, WG * NO>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32 SG_PARAMS) {
    load_prelude(lid);
    let r = wid.x + wid.y * p.wg_x;
    let tile = wid.z;
    // (step.ntok is read so that the binding every product shares stays in the layout.)
    if (r >= ex.r_exp || tile >= tiles[0] || step.ntok == 0u) { return; }
    let id = tiles[1u + 3u * tile];
    let pos0 = tiles[2u + 3u * tile];
    let nt = min(tiles[3u + 3u * tile], TB);
    let g = id * ex.r_exp + r;
    if (g < p.y_off || g - p.y_off >= p.rows) { return; }
    let rb = p.w_off + (g - p.y_off) * p.row_bytes;
    var slot: array<u32, TB>;
    var xr: array<u32, TB>;
    for (var t = 0u; t < nt; t++) {
        slot[t] = order[pos0 + t];
        xr[t] = (slot[t] / ex.x_div) * p.x_stride4;
    }
    let nchunks = p.cols / 8u;
    var acc: array<f32, TB>;
    for (var c = lid; c < nchunks; c += WG) {
        let wv = load8(rb, c);
        for (var t = 0u; t < nt; t++) {
            let xi = xr[t] + 2u * c;
            acc[t] += dot(wv.a, x[xi]) + dot(wv.b, x[xi + 1u]);
        }
    }
    REDUCE_CALL
    if (lid == 0u) {
        for (var t = 0u; t < nt; t++) {
            y[slot[t] * ex.r_exp + r] = red[t * WG];
        }
    }
}
