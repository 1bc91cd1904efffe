// Q2_K: 84-byte blocks {u8 scales[16]; u8 qs[64]; f16 d; f16 dmin}, 256 values, word aligned.
// Value 128h + 32j + l = d*(sc & 15) * ((qs[32h + l] >> 2j) & 3) - dmin*(sc >> 4),
// sc = scales[8h + 2j + (l >= 16)]. Chunk c (8 values) has one h, j and scale.
fn load8(rb: u32, g: u32) -> W8 {
    let bo = rb + (g >> 5u) * 84u;
    let c = g & 31u;
    let h = c >> 4u;
    let j = (c >> 2u) & 3u;
    let l0 = (c & 3u) * 8u;
    let sc = byte_at(bo + 8u * h + 2u * j + (l0 >> 4u));
    let dl = half_at(bo + 80u) * f32(sc & 15u);
    let ml = half_at(bo + 82u) * f32(sc >> 4u);
    let qi = (bo + 16u + 32u * h + l0) >> 2u;
    let sh = 2u * j;
    let v0 = vec4<f32>(unpack4xU8((w[qi] >> sh) & 0x03030303u));
    let v1 = vec4<f32>(unpack4xU8((w[qi + 1u] >> sh) & 0x03030303u));
    return W8(dl * v0 - ml, dl * v1 - ml);
}

fn load_prelude(lid: u32) {}
