// Q4_K: 144-byte blocks {f16 d; f16 dmin; u8 scales[12]; u8 qs[128]}, 256 values, word aligned.
// Sub-block s (32 values) uses 6-bit (scale, min) k4_scale_min(s); value 64j + l is the low nibble
// of qs[32j + l] (s = 2j), value 64j + 32 + l the high nibble (s = 2j + 1).
fn k4_scale_min(bo: u32, s: u32) -> vec2<u32> {
    let sb = bo + 4u;
    if (s < 4u) {
        return vec2<u32>(byte_at(sb + s) & 63u, byte_at(sb + s + 4u) & 63u);
    }
    let a = byte_at(sb + s + 4u);
    return vec2<u32>((a & 15u) | ((byte_at(sb + s - 4u) >> 6u) << 4u), (a >> 4u) | ((byte_at(sb + s) >> 6u) << 4u));
}

fn load8(rb: u32, g: u32) -> W8 {
    let bo = rb + (g >> 5u) * 144u;
    let c = g & 31u;
    let s = c >> 2u;
    let j = s >> 1u;
    let l0 = (c & 3u) * 8u;
    let sm = k4_scale_min(bo, s);
    let d1 = half_at(bo) * f32(sm.x);
    let m1 = half_at(bo + 2u) * f32(sm.y);
    let qi = (bo + 16u + 32u * j + l0) >> 2u;
    let sh = 4u * (s & 1u);
    let v0 = vec4<f32>(unpack4xU8((w[qi] >> sh) & 0x0f0f0f0fu));
    let v1 = vec4<f32>(unpack4xU8((w[qi + 1u] >> sh) & 0x0f0f0f0fu));
    return W8(d1 * v0 - m1, d1 * v1 - m1);
}

fn load_prelude(lid: u32) {}
