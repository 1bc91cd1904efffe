// IQ2_XXS unit = group k = u % 8 (32 values) of block u / 8 (layout in iq2_grid.wgsl): the block's
// d, then the group's two words a0 (grid indices) and a1 (signs, scale) read from 3 aligned words
// (a group starts at an even byte); the 4 grid points signed and dotted, times the group's scale.
const UNIT: u32 = 32u;
const XV: u32 = 8u;

fn dotu(rb: u32, u: u32, xs: ptr<function, array<vec4<f32>, XV>>) -> f32 {
    let bo = rb + (u >> 3u) * 66u;
    let base = bo + 2u + 8u * (u & 7u);
    let i = base >> 2u;
    let odd = (base & 2u) != 0u;
    let w0 = w[i];
    let w1 = w[i + 1u];
    let w2 = w[i + 2u];
    let a0 = select(w0, (w0 >> 16u) | (w1 << 16u), odd);
    let a1 = select(w1, (w1 >> 16u) | (w2 << 16u), odd);
    let db = half_at(bo) * (0.5 + f32(a1 >> 28u)) * 0.25;
    var s = 0.0;
    for (var l = 0u; l < 4u; l++) {
        let gi = (a0 >> (8u * l)) & 255u;
        let n = iq2_signs(a1, l);
        let g0 = bytes_f32(iq2_grid[2u * gi]);
        let g1 = bytes_f32(iq2_grid[2u * gi + 1u]);
        s += dot(iq2_signed(g0, n), (*xs)[2u * l]) + dot(iq2_signed(g1, n >> 4u), (*xs)[2u * l + 1u]);
    }
    return db * s;
}
