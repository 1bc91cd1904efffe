// Q2_K unit = 32 values of one 84-byte block (word aligned): unit u is (block u / 8, half h, run m):
// the values 128h + 32j + 8m + l (planes j = 0..3, l = 0..7), whose quants are bits 2j of the 8 bytes
// qs[32h + 8m + l] (two words: every plane of the run from one read) and whose scales are
// scales[8h + 2j + m / 2] (two words at 8h), value = d*(sc & 15) * q - dmin*(sc >> 4). (A unit of
// one plane's 32 consecutive values read 8 quant words for 8 bytes of its own: on an H100 through
// Vulkan its expert products ran at a third of the IQ2_XXS ones' rate for the same bytes.)
const UNIT: u32 = 32u;
const XV: u32 = 8u;

// Vec4 i = 2j + k of unit u: values 128h + 32j + 8m + 4k .. + 3 of its block.
fn xv_at(u: u32, i: u32) -> u32 {
    return (u >> 3u) * 64u + ((u >> 2u) & 1u) * 32u + (i >> 1u) * 8u + (u & 3u) * 2u + (i & 1u);
}

fn dotu(rb: u32, u: u32, xs: ptr<function, array<vec4<f32>, XV>>) -> f32 {
    let bo = rb + (u >> 3u) * 84u;
    let h = (u >> 2u) & 1u;
    let m = u & 3u;
    let s0 = w[(bo + 8u * h) >> 2u];
    let s1 = w[(bo + 8u * h + 4u) >> 2u];
    let dm = unpack_h2(w[(bo + 80u) >> 2u]);
    let qi = (bo + 16u + 32u * h + 8u * m) >> 2u;
    let q0 = w[qi];
    let q1 = w[qi + 1u];
    let sel = 8u * (m >> 1u);
    var s = 0.0;
    for (var j = 0u; j < 4u; j++) {
        let sc = (select(s0, s1, j >= 2u) >> (16u * (j & 1u) + sel)) & 255u;
        let dl = dm.x * f32(sc & 15u);
        let ml = dm.y * f32(sc >> 4u);
        let sh = 2u * j;
        let qa = vec4<f32>(unpack4xU8((q0 >> sh) & 0x03030303u));
        let qb = vec4<f32>(unpack4xU8((q1 >> sh) & 0x03030303u));
        s += dot(dl * qa - ml, (*xs)[2u * j]) + dot(dl * qb - ml, (*xs)[2u * j + 1u]);
    }
    return s;
}

fn load_prelude(lid: u32) {}
