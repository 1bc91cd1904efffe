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

// Sum of squares of n4 vec4s of the streams from xb4, this thread's share: four loads a round, so
// that their latencies overlap (a round-by-round loop waited on each load in turn), in four sums.
fn sum_squares(lid: u32, xb4: u32, n4: u32) -> f32 {
    var a = vec4<f32>(0.0);
    var b = vec4<f32>(0.0);
    var c = vec4<f32>(0.0);
    var d = vec4<f32>(0.0);
    var i = lid;
    for (; i + 3u * WG < n4; i += 4u * WG) {
        let v0 = x4[xb4 + i];
        let v1 = x4[xb4 + i + WG];
        let v2 = x4[xb4 + i + 2u * WG];
        let v3 = x4[xb4 + i + 3u * WG];
        a += v0 * v0;
        b += v1 * v1;
        c += v2 * v2;
        d += v3 * v3;
    }
    for (; i < n4; i += WG) {
        let v = x4[xb4 + i];
        a += v * v;
    }
    let s = (a + b) + (c + d);
    return (s.x + s.y) + (s.z + s.w);
}

// sum_s w[s] X[s] for vec4 j of a token's n streams of e4 vec4s from xb4: every stream's load issued
// before the sum (in stream order).
fn collapse4(xb4: u32, e4: u32, n: u32, j: u32, w: array<f32, 8>) -> vec4<f32> {
    var v: array<vec4<f32>, 8>;
    for (var s = 0u; s < 8u; s++) {
        if (s < n) { v[s] = x4[xb4 + s * e4 + j]; }
    }
    var acc = vec4<f32>(0.0);
    for (var s = 0u; s < 8u; s++) {
        if (s < n) { acc += w[s] * v[s]; }
    }
    return acc;
}
