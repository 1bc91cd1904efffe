// F16: chunk g of a row is 16 bytes = 4 aligned words (rows are 16-byte multiples: cols % 8 == 0).
fn load8(rb: u32, g: u32) -> W8 {
    let i = (rb + 16u * g) >> 2u;
    let h0 = unpack_h2(w[i]);
    let h1 = unpack_h2(w[i + 1u]);
    let h2 = unpack_h2(w[i + 2u]);
    let h3 = unpack_h2(w[i + 3u]);
    return W8(vec4<f32>(h0, h1), vec4<f32>(h2, h3));
}

fn load_prelude(lid: u32) {}
