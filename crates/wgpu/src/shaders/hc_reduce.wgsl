// Workgroup sum in two levels (every adapter): 16 threads each sum a column of 16 partials, then
// every thread sums the 16 column sums in the same order, so all get the same total. Two barriers
// (a 256-wide tree takes 8 plus 2); no barrier is needed before the next call, as every read of
// `red` comes before the second barrier and every read of `part` before the next call's first.
const WG: u32 = 256u;
const PARTS: u32 = 16u;  // WG = PARTS x PARTS
var<workgroup> red: array<f32, WG>;
var<workgroup> part: array<f32, PARTS>;

fn wg_sum(lid: u32, v: f32) -> f32 {
    red[lid] = v;
    workgroupBarrier();
    if (lid < PARTS) {
        // Column `lid` (red[i * PARTS + lid]): neighbouring threads read neighbouring words.
        var s = 0.0;
        for (var i = 0u; i < PARTS; i++) { s += red[i * PARTS + lid]; }
        part[lid] = s;
    }
    workgroupBarrier();
    var total = 0.0;
    for (var i = 0u; i < PARTS; i++) { total += part[i]; }
    return total;
}

fn sigmoid(v: f32) -> f32 {
    return 1.0 / (1.0 + exp(-v));
}
