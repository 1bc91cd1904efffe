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
