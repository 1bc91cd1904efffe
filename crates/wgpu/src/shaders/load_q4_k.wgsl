// Q4_K chunk c (8 values) of a block (q4_k_scales.wgsl has the layout).
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
