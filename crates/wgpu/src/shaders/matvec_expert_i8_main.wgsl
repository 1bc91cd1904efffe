// Routed-expert products of IQ2_XXS weights against Q8_K activations (quantize_q8_k.wgsl: packed
// signed bytes `xq`, block scales `xd`), the CPU's Precision::Fast product (`dot_iq2_xxs_q8_k`):
// each group's grid bytes signed bytewise ((g ^ m) + (m & 0x01): grid bytes are 8..43, so no carry
// crosses a byte) and dotted with dot4I8Packed (exact), times (2 scale + 1), d_w, d_x / 8. Slots and
// rows as matvec_expert_main.wgsl (one dispatch per binding part, a workgroup RW rows of one slot).
struct Expert {
    k: u32,
    x_div: u32,
    r_exp: u32,
    pad: u32,
}
@group(0) @binding(5) var<uniform> ex: Expert;
@group(0) @binding(6) var<storage, read> ids: array<u32>;
@group(0) @binding(7) var<storage, read> xd: array<f32>;

const RW: u32 = (WG / SEG) * R;

// Byte masks of sign bits 0..3 (0xff where the value is negative).
fn sign_mask(s: u32) -> u32 {
    return ((s & 1u) * 0xffu) | (((s >> 1u) & 1u) * 0xff00u) | (((s >> 2u) & 1u) * 0xff0000u) | (((s >> 3u) & 1u) * 0xff000000u);
}

fn signed_bytes(g: u32, m: u32) -> u32 {
    return (g ^ m) + (m & 0x01010101u);
}

// Group u of the row at rb against its 32 activation bytes: d_w (2 scale + 1) times the integer dot.
fn dot_group(rb: u32, u: u32, x0: vec4<u32>, x1: vec4<u32>) -> f32 {
    let bo = rb + (u >> 3u) * 66u;
    let base = bo + 2u + 8u * (u & 7u);
    let a0 = word_at(base);
    let a1 = word_at(base + 4u);
    let xs = array<u32, 8>(x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w);
    var s = 0;
    for (var l = 0u; l < 4u; l++) {
        let gi = (a0 >> (8u * l)) & 255u;
        let sg = iq2_signs(a1, l);
        s += dot4I8Packed(signed_bytes(iq2_grid[2u * gi], sign_mask(sg)), xs[2u * l]);
        s += dot4I8Packed(signed_bytes(iq2_grid[2u * gi + 1u], sign_mask(sg >> 4u)), xs[2u * l + 1u]);
    }
    return half_at(bo) * f32(i32(2u * (a1 >> 28u) + 1u) * s);
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    load_prelude(lid);
    let rr0 = (wid.x + wid.y * p.wg_x) * RW;
    let slot = wid.z;
    if (rr0 >= ex.r_exp || slot >= step.ntok * ex.k) { return; }
    let g0 = ids[slot] * ex.r_exp;
    let xrow = slot / ex.x_div;
    let xq0 = xrow * (p.cols / 16u);
    let xd0 = xrow * (p.cols / 256u);
    let r0 = rr0 + (lid / SEG) * R;
    var acc: array<f32, NS>;
    for (var u = lid % SEG; u < p.cols / 32u; u += SEG) {
        let x0 = x[xq0 + 2u * u];
        let x1 = x[xq0 + 2u * u + 1u];
        let dx = xd[xd0 + u / 8u] * 0.125;
        for (var r = 0u; r < R; r++) {
            let rr = r0 + r;
            let g = g0 + rr;
            if (rr < ex.r_exp && in_part(g)) {
                acc[r] += dot_group(p.w_off + (g - p.y_off) * p.row_bytes, u, x0, x1) * dx;
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
