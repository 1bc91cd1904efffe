// The products' reduction. A segment of SEG threads sums each row (and token) of a workgroup, every
// thread holding NS = R x TB partial sums; output o = (lid / SEG) * NS + s. Its SEG partials are
// summed in eights, in order, then the SEG / 8 eights in order: the same sum whatever R, TB and the
// workgroup's other rows, so a decode row equals a batched row bit for bit. Two barriers.
const NS: u32 = R * TB;
const NOUT: u32 = (WG / SEG) * NS;
const NE: u32 = SEG / 8u;
var<workgroup> red: array<f32, WG * NS>;
var<workgroup> red8: array<f32, NOUT * NE>;

fn seg_partials(lid: u32, acc: array<f32, NS>) {
    let o0 = (lid / SEG) * NS;
    let lane = lid % SEG;
    for (var s = 0u; s < NS; s++) { red[(o0 + s) * SEG + lane] = acc[s]; }
    workgroupBarrier();
    for (var e = lid; e < NOUT * NE; e += WG) {
        var v = red[e * 8u];
        for (var i = 1u; i < 8u; i++) { v += red[e * 8u + i]; }
        red8[e] = v;
    }
    workgroupBarrier();
}

// Output o's sum (after seg_partials).
fn seg_total(o: u32) -> f32 {
    var v = red8[o * NE];
    for (var i = 1u; i < NE; i++) { v += red8[o * NE + i]; }
    return v;
}
