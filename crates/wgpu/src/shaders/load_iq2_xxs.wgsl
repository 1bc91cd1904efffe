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

fn load8(rb: u32, g: u32) -> W8 {
    let bo = rb + (g >> 5u) * 66u;
    let c = g & 31u;
    let k = c >> 2u;
    let l = c & 3u;
    let d = half_at(bo);
    let a0 = word_at(bo + 2u + 8u * k);
    let a1 = word_at(bo + 6u + 8u * k);
    let db = d * (0.5 + f32(a1 >> 28u)) * 0.25;
    let gi = (a0 >> (8u * l)) & 255u;
    let s7 = (a1 >> (7u * l)) & 127u;
    let signs = s7 | ((countOneBits(s7) & 1u) << 7u);
    let g0 = vec4<f32>(unpack4xU8(iq2_grid[2u * gi]));
    let g1 = vec4<f32>(unpack4xU8(iq2_grid[2u * gi + 1u]));
    let n0 = vec4<bool>((signs & 1u) != 0u, (signs & 2u) != 0u, (signs & 4u) != 0u, (signs & 8u) != 0u);
    let n1 = vec4<bool>((signs & 16u) != 0u, (signs & 32u) != 0u, (signs & 64u) != 0u, (signs & 128u) != 0u);
    let v0 = db * g0;
    let v1 = db * g1;
    return W8(select(v0, -v0, n0), select(v1, -v1, n1));
}
