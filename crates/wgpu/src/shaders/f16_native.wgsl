// Two f16 (low half first) -> f32 with the built-in (needs wgpu's SHADER_F16_IN_F32 downlevel flag;
// llvmpipe has it only together with SHADER_F16).
fn unpack_h2(v: u32) -> vec2<f32> {
    return unpack2x16float(v);
}
