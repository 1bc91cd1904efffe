// Q2_K unit = 32 values of one 84-byte block (word aligned): unit u is (block u / 8, h, j) with
// values 128h + 32j + l = d*(sc & 15) * ((qs[32h + l] >> 2j) & 3) - dmin*(sc >> 4), sc =
// scales[8h + 2j + (l >= 16)]: the two scale bytes share a word, the 32 quants are 8 words.
const UNIT: u32 = 32u;
const XV: u32 = 8u;

fn dotu(rb: u32, u: u32, xs: ptr<function, array<vec4<f32>, XV>>) -> f32 {
    let bo = rb + (u >> 3u) * 84u;
    let c = u & 7u;
    let h = c >> 2u;
    let j = c & 3u;
    let so = 8u * h + 2u * j;
    let sw = w[(bo + so) >> 2u] >> (8u * (so & 3u));
    let dm = unpack_h2(w[(bo + 80u) >> 2u]);
    let qi = (bo + 16u + 32u * h) >> 2u;
    let sh = 2u * j;
    var s = 0.0;
    for (var half = 0u; half < 2u; half++) {
        let sc = (sw >> (8u * half)) & 255u;
        let dl = dm.x * f32(sc & 15u);
        let ml = dm.y * f32(sc >> 4u);
        for (var k = 0u; k < 4u; k++) {
            let q = vec4<f32>(unpack4xU8((w[qi + 4u * half + k] >> sh) & 0x03030303u));
            s += dot(dl * q - ml, (*xs)[4u * half + k]);
        }
    }
    return s;
}

fn load_prelude(lid: u32) {}
