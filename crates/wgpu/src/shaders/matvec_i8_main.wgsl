// y[t][y_off + row] = W[row] . x[t] for Q8_0 weights against Q8_0 activations (quantize_q8_0.wgsl:
// packed signed bytes `x`, block scales `xd`), the CPU's Precision::Fast product: each block's
// integer dot by dot4I8Packed (exact), times d_w * d_x. Workgroup and reduction as matvec_main.wgsl
// (SEG threads a row, R rows a thread sharing a unit's activation words), one token (TB = 1).
// Bindings 0-4 and `Params`: matvec_common.wgsl, its activations `x` read as packed bytes.
@group(0) @binding(5) var<storage, read> xd: array<f32>;

const RW: u32 = (WG / SEG) * R;

// The block's 32 weight bytes as 8 words and its f16 scale (a 34-byte block at an even byte).
fn dot_block(rb: u32, u: u32, x0: vec4<u32>, x1: vec4<u32>) -> f32 {
    let bo = rb + 34u * u;
    let i = bo >> 2u;
    let odd = (bo & 2u) != 0u;
    var wd: array<u32, 9>;
    for (var k = 0u; k < 9u; k++) { wd[k] = w[i + k]; }
    let d = unpack_h2(select(wd[0], wd[0] >> 16u, odd)).x;
    var q: array<u32, 8>;
    for (var k = 0u; k < 8u; k++) { q[k] = select((wd[k] >> 16u) | (wd[k + 1u] << 16u), wd[k + 1u], odd); }
    var s = dot4I8Packed(q[0], x0.x) + dot4I8Packed(q[1], x0.y) + dot4I8Packed(q[2], x0.z) + dot4I8Packed(q[3], x0.w);
    s += dot4I8Packed(q[4], x1.x) + dot4I8Packed(q[5], x1.y) + dot4I8Packed(q[6], x1.z) + dot4I8Packed(q[7], x1.w);
    return f32(s) * d;
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let row0 = (wid.x + wid.y * p.wg_x) * RW;
    if (row0 >= p.rows || step.ntok == 0u) { return; }
    let r0 = row0 + (lid / SEG) * R;
    var acc: array<f32, NS>;
    let nb = p.cols / 32u;
    for (var u = lid % SEG; u < nb; u += SEG) {
        let x0 = x[2u * u];
        let x1 = x[2u * u + 1u];
        let dx = xd[u];
        for (var r = 0u; r < R; r++) {
            let row = r0 + r;
            if (row >= p.rows) { break; }
            acc[r] += dot_block(p.w_off + row * p.row_bytes, u, x0, x1) * dx;
        }
    }
    seg_partials(lid, acc);
    for (var o = lid; o < RW; o += WG) {
        let row = row0 + o;
        if (row < p.rows) { y[p.y_off + row] = seg_total(o); }
    }
}
