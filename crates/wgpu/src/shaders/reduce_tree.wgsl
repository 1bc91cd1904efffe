// Tree reduction in workgroup memory (works on every adapter): afterwards red[o * WG] holds the
// workgroup sum of acc[o].
fn reduce(lid: u32, acc: array<f32, NO>) {
    for (var o = 0u; o < NO; o++) { red[o * WG + lid] = acc[o]; }
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if (lid < s) {
            for (var o = 0u; o < NO; o++) { red[o * WG + lid] += red[o * WG + lid + s]; }
        }
        workgroupBarrier();
    }
}
