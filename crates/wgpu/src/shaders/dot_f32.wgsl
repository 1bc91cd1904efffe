// F32 unit = 8 values, 8 aligned words (rows are 32-byte multiples: cols % 8 == 0). The MTP block's
// HC and router matrices are F32 in the released MTP file.
const UNIT: u32 = 8u;
const XV: u32 = 2u;

fn dotu(rb: u32, u: u32, xs: ptr<function, array<vec4<f32>, XV>>) -> f32 {
    let i = (rb + 32u * u) >> 2u;
    let a = vec4<f32>(bitcast<f32>(w[i]), bitcast<f32>(w[i + 1u]), bitcast<f32>(w[i + 2u]), bitcast<f32>(w[i + 3u]));
    let b = vec4<f32>(bitcast<f32>(w[i + 4u]), bitcast<f32>(w[i + 5u]), bitcast<f32>(w[i + 6u]), bitcast<f32>(w[i + 7u]));
    return dot(a, (*xs)[0]) + dot(b, (*xs)[1]);
}

fn load_prelude(lid: u32) {}
