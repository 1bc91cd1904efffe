// Y[t][y_off + row] = W[row] . X[t] for a prefill chunk as a tiled product: a workgroup of 256 takes
// BM rows x BN tokens, walking the columns in steps of BK (4 chunks of 8): each step its threads
// dequantize the tile's BM x BK weights once (one chunk each, `load8`) and load the BN x BK inputs
// into workgroup memory, then each thread accumulates a 4 x 4 block of outputs from them. Every weight
// is dequantized once per BN tokens (the batched mat-vec: once per 4). Sums run over the columns in
// order, unlike the mat-vec's (a long step's rows are not decode rows bit for bit; short steps keep
// the mat-vec). A grouped product's tile lies in one group (the host checks group_rows % BM == 0).
@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    load_prelude(lid);
    let row0 = (wid.x + wid.y * p.wg_x) * BM;
    let t0 = wid.z * BN;
    let ntok = step.ntok;
    // Uniform exits only: every thread reaches the barriers.
    if (row0 >= p.rows || t0 >= ntok) { return; }
    // Loading: thread lid dequantizes chunk lid % 4 of tile row lid / 4 and loads the same 8 columns
    // of tile token lid / 4.
    let lr = lid / 4u;
    let wrow = row0 + lr;
    let rb = p.w_off + min(wrow, p.rows - 1u) * p.row_bytes;
    let xbase = p.x_off4 + select(0u, (p.y_off + row0) / max(p.group_rows, 1u) * p.group_x4, p.group_rows != 0u);
    let xt = t0 + lr;
    let xrow = xbase + min(xt, ntok - 1u) * p.x_stride4;
    let acc = tile_products(lid, wrow < p.rows, rb, xt < ntok, xrow);
    // Computing: rows 4 * (lid / 16) .., tokens 4 * (lid % 16) .. of the tile.
    let tr = lid / 16u;
    let tt = lid % 16u;
    for (var i = 0u; i < 4u; i++) {
        let row = row0 + tr * 4u + i;
        if (row < p.rows) {
            for (var j = 0u; j < 4u; j++) {
                let t = t0 + tt * 4u + j;
                if (t < ntok) { y[t * p.y_stride + p.y_off + row] = acc[i][j]; }
            }
        }
    }
}
