// Routed-expert products of a prefill chunk as tiled products (matmul_main.wgsl's tiles): a workgroup
// takes BM rows of one expert and a tile of up to BN slots that chose it (expert_groups with tiles of
// BN), so each weight is dequantized once per BN slots. y[slot][r] = W_id[r] . x[slot / x_div]. A row
// that lies in another binding part is left to that part's dispatch (an expert may straddle parts).

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    load_prelude(lid);
    let r0 = (wid.x + wid.y * p.wg_x) * BM;
    let tile = wid.z;
    // Uniform exits only: every thread reaches the barriers. (step.ntok keeps the shared binding.)
    if (r0 >= ex.r_exp || tile >= tiles[0] || step.ntok == 0u) { return; }
    let id = tiles[1u + 3u * tile];
    let pos0 = tiles[2u + 3u * tile];
    let nt = min(tiles[3u + 3u * tile], BN);
    let lr = lid / 4u;
    // The loader's weight row (global row g of the stack, in this part or not) and input slot.
    let g = id * ex.r_exp + r0 + lr;
    let wok = r0 + lr < ex.r_exp && in_part(g);
    let rb = p.w_off + select(0u, g - p.y_off, wok) * p.row_bytes;
    let xrow = (order[pos0 + min(lr, nt - 1u)] / ex.x_div) * p.x_stride4;
    let acc = tile_products(lid, wok, rb, lr < nt, xrow);
    let tr = lid / 16u;
    let tt = lid % 16u;
    for (var i = 0u; i < 4u; i++) {
        let r = r0 + tr * 4u + i;
        let gr = id * ex.r_exp + r;
        if (r < ex.r_exp && in_part(gr)) {
            for (var j = 0u; j < 4u; j++) {
                let t = tt * 4u + j;
                if (t < nt) { y[order[pos0 + t] * ex.r_exp + r] = acc[i][j]; }
            }
        }
    }
}
