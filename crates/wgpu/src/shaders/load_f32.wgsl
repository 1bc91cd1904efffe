// F32: chunk g of a row is 32 bytes = 8 aligned words (rows are 32-byte multiples: cols % 8 == 0).
fn load8(rb: u32, g: u32) -> W8 {
    let i = (rb + 32u * g) >> 2u;
    let a = vec4<f32>(bitcast<f32>(w[i]), bitcast<f32>(w[i + 1u]), bitcast<f32>(w[i + 2u]), bitcast<f32>(w[i + 3u]));
    let b = vec4<f32>(bitcast<f32>(w[i + 4u]), bitcast<f32>(w[i + 5u]), bitcast<f32>(w[i + 6u]), bitcast<f32>(w[i + 7u]));
    return W8(a, b);
}

fn load_prelude(lid: u32) {}
