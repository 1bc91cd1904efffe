// Shared part of every mat-vec / batched-product module: bindings, unaligned word reads, and the
// 8-weight chunk type that each quant type's `load8` returns. Weights are the raw GGUF bytes of one
// binding part (whole rows), read as u32 words; blocks of 34 or 66 bytes start at any even byte.
struct Params {
    rows: u32,       // rows in this binding part
    cols: u32,       // elements per row (multiple of 8)
    row_bytes: u32,  // bytes per row
    y_off: u32,      // output index of this part's first row
    wg_x: u32,       // workgroups along x (rows = x + y * wg_x)
    x_stride4: u32,  // activation row stride in vec4s
    y_stride: u32,   // output row stride in floats
    w_off: u32,      // byte offset of the part's first row in its binding (imported windows)
    x_off4: u32,     // offset of this dispatch's inputs in each activation row, in vec4s
    group_rows: u32, // grouped product: rows per group (0: none); row g's inputs start group_x4 * (g / group_rows) further
    group_x4: u32,   // grouped product: vec4s of one group's inputs
    pad2: u32,
}
struct Step { ntok: u32, pos: u32, pad0: u32, pad1: u32 }

@group(0) @binding(0) var<storage, read> w: array<u32>;
@group(0) @binding(1) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(0) @binding(3) var<uniform> p: Params;
@group(0) @binding(4) var<uniform> step: Step;

struct W8 { a: vec4<f32>, b: vec4<f32> }

// The 4 bytes of v as floats without int-to-float conversions (1/8 of the float rate on Hopper):
// 2^23 + b has b as its mantissa, and the subtraction is exact.
fn bytes_f32(v: u32) -> vec4<f32> {
    let b = vec4<u32>(v, v >> 8u, v >> 16u, v >> 24u) & vec4<u32>(255u);
    return bitcast<vec4<f32>>(b | vec4<u32>(0x4B000000u)) - vec4<f32>(8388608.0);
}

// The 4 signed bytes of v as floats, the same way: b + 128 (the sign bit flipped) is in 0..255, and
// 2^23 + 128 is exact.
fn sbytes_f32(v: u32) -> vec4<f32> {
    let u = v ^ 0x80808080u;
    let b = vec4<u32>(u, u >> 8u, u >> 16u, u >> 24u) & vec4<u32>(255u);
    return bitcast<vec4<f32>>(b | vec4<u32>(0x4B000000u)) - vec4<f32>(8388736.0);
}

// Whether global row g lies in this dispatch's binding part (a stacked expert tensor's parts).
fn in_part(g: u32) -> bool {
    return g >= p.y_off && g - p.y_off < p.rows;
}

// 4 bytes starting at an even byte offset.
fn word_at(b: u32) -> u32 {
    let i = b >> 2u;
    if ((b & 2u) == 0u) { return w[i]; }
    return (w[i] >> 16u) | (w[i + 1u] << 16u);
}

// One byte.
fn byte_at(b: u32) -> u32 {
    return (w[b >> 2u] >> ((b & 3u) * 8u)) & 255u;
}

// f16 at an even byte offset (exact f16 -> f32 through `unpack_h2`, no f16 arithmetic).
fn half_at(b: u32) -> f32 {
    let v = w[b >> 2u];
    return unpack_h2(select(v, v >> 16u, (b & 2u) != 0u)).x;
}
