// Q8_0: 34-byte blocks {f16 d; i8 qs[32]}; 4 chunks of 8 per block. value = d * q.
fn load8(rb: u32, g: u32) -> W8 {
    let bo = rb + (g >> 2u) * 34u;
    let d = half_at(bo);
    let qb = bo + 2u + 8u * (g & 3u);
    let q0 = sbytes_f32(word_at(qb));
    let q1 = sbytes_f32(word_at(qb + 4u));
    return W8(q0 * d, q1 * d);
}

fn load_prelude(lid: u32) {}
