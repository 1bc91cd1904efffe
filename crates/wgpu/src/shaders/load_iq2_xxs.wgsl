// IQ2_XXS chunk g (8 values) of a row (iq2_grid.wgsl has the layout).
fn load8(rb: u32, g: u32) -> W8 {
    let bo = rb + (g >> 5u) * 66u;
    let c = g & 31u;
    let k = c >> 2u;
    let l = c & 3u;
    let d = half_at(bo);
    let a0 = word_at(bo + 2u + 8u * k);
    let a1 = word_at(bo + 6u + 8u * k);
    let db = d * (0.5 + f32(a1 >> 28u)) * 0.25;
    let gi = (a0 >> (8u * l)) & 255u;
    let n = iq2_signs(a1, l);
    let v0 = db * bytes_f32(iq2_grid[2u * gi]);
    let v1 = db * bytes_f32(iq2_grid[2u * gi + 1u]);
    return W8(iq2_signed(v0, n), iq2_signed(v1, n >> 4u));
}
