// Shared by the activation quantizers (quantize_q8_0.wgsl, quantize_q8_k.wgsl): token rows of `x`
// (x_stride floats apart) to packed signed bytes `xq` (cols / 4 words a row) and block scales `xd`.
struct QParams { cols: u32, x_stride: u32, pad0: u32, pad1: u32 }
struct Step { ntok: u32, pos: u32, pad0: u32, pad1: u32 }

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read_write> xq: array<u32>;
@group(0) @binding(2) var<storage, read_write> xd: array<f32>;
@group(0) @binding(3) var<uniform> qp: QParams;
@group(0) @binding(4) var<uniform> step: Step;
