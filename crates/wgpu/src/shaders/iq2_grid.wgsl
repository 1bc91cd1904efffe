// IQ2_XXS: 66-byte blocks {f16 d; u8 qs[64]}, 256 values in 8 groups of 32. Group k has two words
// a0 (4 grid indices) and a1 (4 x 7 sign bits, 4-bit scale in the top nibble). Chunk c (8 values)
// is grid point (a0 >> 8l) & 255 with signs ksigns((a1 >> 7l) & 127), l = c & 3, scaled by
// d * (0.5 + (a1 >> 28)) * 0.25. The grid (2 words per point, from ds4_quant's table) is a storage
// buffer uploaded once per device (a WGSL const array indexed at run time gets copied whole per
// access by some compilers: 30x slower on lavapipe), copied once per workgroup into workgroup
// memory. ksigns is computed: the 8th sign makes the count of minus signs even.
@group(0) @binding(5) var<storage, read> iq2_grid_buf: array<u32, 512>;
var<workgroup> iq2_grid: array<u32, 512>;

fn load_prelude(lid: u32) {
    for (var i = lid; i < 512u; i += WG) { iq2_grid[i] = iq2_grid_buf[i]; }
    workgroupBarrier();
}

// The 8 signs of chunk l of a group whose sign word is a1: 7 stored bits, the 8th makes the count
// of minus signs even.
fn iq2_signs(a1: u32, l: u32) -> u32 {
    let s7 = (a1 >> (7u * l)) & 127u;
    return s7 | ((countOneBits(s7) & 1u) << 7u);
}

// v with the signs of bits 0..3 of s applied.
fn iq2_signed(v: vec4<f32>, s: u32) -> vec4<f32> {
    return select(v, -v, vec4<bool>((s & 1u) != 0u, (s & 2u) != 0u, (s & 4u) != 0u, (s & 8u) != 0u));
}
