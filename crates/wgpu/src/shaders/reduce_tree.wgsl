// Tree reduction in workgroup memory (works on every adapter): afterwards red[t * WG] holds the
// workgroup sum of acc[t].
fn reduce(lid: u32, acc: array<f32, TB>) {
    for (var t = 0u; t < TB; t++) { red[t * WG + lid] = acc[t]; }
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if (lid < s) {
            for (var t = 0u; t < TB; t++) { red[t * WG + lid] += red[t * WG + lid + s]; }
        }
        workgroupBarrier();
    }
}
