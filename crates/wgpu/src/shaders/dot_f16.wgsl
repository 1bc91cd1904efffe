// F16 unit = 8 values, 4 aligned words (rows are 16-byte multiples: cols % 8 == 0).
const UNIT: u32 = 8u;
const XV: u32 = 2u;

fn dotu(rb: u32, u: u32, xs: ptr<function, array<vec4<f32>, XV>>) -> f32 {
    let i = (rb + 16u * u) >> 2u;
    let a = vec4<f32>(unpack_h2(w[i]), unpack_h2(w[i + 1u]));
    let b = vec4<f32>(unpack_h2(w[i + 2u]), unpack_h2(w[i + 3u]));
    return dot(a, (*xs)[0]) + dot(b, (*xs)[1]);
}

fn load_prelude(lid: u32) {}
