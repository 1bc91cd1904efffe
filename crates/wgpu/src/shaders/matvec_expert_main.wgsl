// Routed-expert products: y[slot][r] = W_id[r] . x[slot / x_div] for every (token, slot) of the step,
// id = ids[slot], W_id = rows [id * r_exp, (id + 1) * r_exp) of a stacked expert tensor. One dispatch
// per binding part (Params.y_off = the part's first global row): a row that lies in another part is
// skipped, so an expert may straddle parts. A workgroup takes RW = (WG / SEG) x R rows of one slot,
// walked as the mat-vec walks them (matvec_main.wgsl), so its rows equal the grouped kernel's rows
// (matvec_expert_grouped_main.wgsl) bit for bit.
struct Expert {
    k: u32,         // slots per token
    x_div: u32,     // slots per activation row (k: rows of xn; 1: one row per slot)
    r_exp: u32,     // rows per expert (output row stride)
    pad: u32,
}
@group(0) @binding(5) var<uniform> ex: Expert;
@group(0) @binding(6) var<storage, read> ids: array<u32>;

const RW: u32 = (WG / SEG) * R;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    load_prelude(lid);
    let rr0 = (wid.x + wid.y * p.wg_x) * RW;
    let slot = wid.z;
    if (rr0 >= ex.r_exp || slot >= step.ntok * ex.k) { return; }
    let g0 = ids[slot] * ex.r_exp;
    let xb0 = (slot / ex.x_div) * p.x_stride4;
    let r0 = rr0 + (lid / SEG) * R;
    var acc: array<f32, NS>;
    var xs: array<vec4<f32>, XV>;
    for (var u = lid % SEG; u < p.cols / UNIT; u += SEG) {
        for (var i = 0u; i < XV; i++) { xs[i] = x[xb0 + xv_at(u, i)]; }
        for (var r = 0u; r < R; r++) {
            let rr = r0 + r;
            let g = g0 + rr;
            if (rr < ex.r_exp && in_part(g)) {
                acc[r] += dotu(p.w_off + (g - p.y_off) * p.row_bytes, u, &xs);
            }
        }
    }
    seg_partials(lid, acc);
    for (var o = lid; o < RW; o += WG) {
        let rr = rr0 + o;
        if (rr < ex.r_exp && in_part(g0 + rr)) {
            y[slot * ex.r_exp + rr] = seg_total(o);
        }
    }
}
