// Routed-expert products of a short multi-token step: like matvec_expert_main, but a workgroup takes
// RW rows for a tile of up to TB slots that chose the same expert (from expert_groups), each weight
// unit read once for the tile's slots; every row sums as the per-slot kernel sums it (bit for bit).
// y[slot][r] = W_id[r] . x[slot / x_div].
const RW: u32 = (WG / SEG) * R;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    load_prelude(lid);
    let rr0 = (wid.x + wid.y * p.wg_x) * RW;
    let tile = wid.z;
    // (step.ntok is read so that the binding every product shares stays in the layout.)
    if (rr0 >= ex.r_exp || tile >= tiles[0] || step.ntok == 0u) { return; }
    let g0 = tiles[1u + 3u * tile] * ex.r_exp;
    let pos0 = tiles[2u + 3u * tile];
    let nt = min(tiles[3u + 3u * tile], TB);
    var slot: array<u32, TB>;
    var xr: array<u32, TB>;
    for (var t = 0u; t < nt; t++) {
        slot[t] = order[pos0 + t];
        xr[t] = (slot[t] / ex.x_div) * p.x_stride4;
    }
    let r0 = rr0 + (lid / SEG) * R;
    var acc: array<f32, NS>;
    var xs: array<vec4<f32>, XV>;
    for (var u = lid % SEG; u < p.cols / UNIT; u += SEG) {
        for (var t = 0u; t < TB; t++) {
            if (t >= nt) { break; }
            for (var i = 0u; i < XV; i++) { xs[i] = x[xr[t] + xv_at(u, i)]; }
            for (var r = 0u; r < R; r++) {
                let rr = r0 + r;
                let g = g0 + rr;
                if (rr < ex.r_exp && in_part(g)) {
                    acc[r * TB + t] += dotu(p.w_off + (g - p.y_off) * p.row_bytes, u, &xs);
                }
            }
        }
    }
    seg_partials(lid, acc);
    for (var o = lid; o < RW * TB; o += WG) {
        let rr = rr0 + o / TB;
        let t = o % TB;
        if (t < nt && rr < ex.r_exp && in_part(g0 + rr)) {
            y[slot[t] * ex.r_exp + rr] = seg_total(o);
        }
    }
}
