// Q8_0 unit = one 34-byte block {f16 d; i8 qs[32]} at an even byte: 9 aligned words hold it (d in the
// low or high half of the first, by the block's alignment; the quants shifted by half a word or not).
// Returns d * sum of the 32 products, the quants summed in order.
const UNIT: u32 = 32u;
const XV: u32 = 8u;

fn dotu(rb: u32, u: u32, xs: ptr<function, array<vec4<f32>, XV>>) -> f32 {
    let bo = rb + 34u * u;
    let i = bo >> 2u;
    let odd = (bo & 2u) != 0u;
    var wd: array<u32, 9>;
    for (var k = 0u; k < 9u; k++) { wd[k] = w[i + k]; }
    let d = unpack_h2(select(wd[0], wd[0] >> 16u, odd)).x;
    var s = 0.0;
    for (var k = 0u; k < 8u; k++) {
        let q = select((wd[k] >> 16u) | (wd[k + 1u] << 16u), wd[k + 1u], odd);
        s += dot(sbytes_f32(q), (*xs)[k]);
    }
    return d * s;
}

fn load_prelude(lid: u32) {}
