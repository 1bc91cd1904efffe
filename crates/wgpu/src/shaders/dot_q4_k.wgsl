// Q4_K unit = one 32-value sub-block s = u % 8 of block u / 8 (layout in q4_k_scales.wgsl): its
// (scale, min), then 8 words of nibbles.
const UNIT: u32 = 32u;
const XV: u32 = 8u;

fn dotu(rb: u32, u: u32, xs: ptr<function, array<vec4<f32>, XV>>) -> f32 {
    let bo = rb + (u >> 3u) * 144u;
    let s = u & 7u;
    let sm = k4_scale_min(bo, s);
    let dm = unpack_h2(w[bo >> 2u]);
    let d1 = dm.x * f32(sm.x);
    let m1 = dm.y * f32(sm.y);
    let qi = (bo + 16u + 32u * (s >> 1u)) >> 2u;
    let sh = 4u * (s & 1u);
    var acc = 0.0;
    for (var k = 0u; k < 8u; k++) {
        let q = vec4<f32>(unpack4xU8((w[qi + k] >> sh) & 0x0f0f0f0fu));
        acc += dot(d1 * q - m1, (*xs)[k]);
    }
    return acc;
}

fn load_prelude(lid: u32) {}
