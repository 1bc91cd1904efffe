// Activation rows to Q8_K as the CPU's `ds4_quant::quantize_row_q8_k` makes them (the activations of
// the K-quant and IQ2_XXS products under Precision::Fast): per block of 256, the value of largest
// magnitude (the first, as the CPU scans) maps to -127: iscale = -127 / max, q = min(round-even(iscale
// x), 127), d = 1 / iscale (both divisions refined by an fma step: the correctly rounded value where
// fma is fused, as on GPUs; Vulkan allows 2.5 ulp for a division; lavapipe's fma is not fused and
// can leave d an ulp off). Workgroup (block, token) of 64 threads, 4 values each: xq gets the block's 64
// words of packed signed bytes, xd its d. (No bsums: the IQ2_XXS product does not take them.)
// (Bindings: quantize_common.wgsl; xd holds one scale a block of 256.)

var<workgroup> best: array<vec2<f32>, 64>;  // (|v|, v) of the largest magnitude so far
var<workgroup> best_i: array<u32, 64>;      // its index in the block

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let b = wid.x;
    let t = wid.y;
    let nb = qp.cols / 256u;
    if (b >= nb || t >= step.ntok) { return; }
    let xb = t * qp.x_stride + 256u * b + 4u * lid;
    let v = array<f32, 4>(x[xb], x[xb + 1u], x[xb + 2u], x[xb + 3u]);
    var am = abs(v[0]);
    var mv = v[0];
    var mi = 0u;
    for (var j = 1u; j < 4u; j++) {
        if (abs(v[j]) > am) { am = abs(v[j]); mv = v[j]; mi = j; }
    }
    best[lid] = vec2<f32>(am, mv);
    best_i[lid] = 4u * lid + mi;
    workgroupBarrier();
    // The block's largest magnitude, ties to the lowest index (the CPU keeps the first).
    for (var s = 32u; s > 0u; s >>= 1u) {
        if (lid < s) {
            let o = best[lid + s];
            let oi = best_i[lid + s];
            if (o.x > best[lid].x || (o.x == best[lid].x && oi < best_i[lid])) {
                best[lid] = o;
                best_i[lid] = oi;
            }
        }
        workgroupBarrier();
    }
    let top = best[0];
    let wi = t * (qp.cols / 4u) + 64u * b + lid;
    if (top.x == 0.0) {
        xq[wi] = 0u;
        if (lid == 0u) { xd[t * nb + b] = 0.0; }
        return;
    }
    let mx = top.y;
    var is = -127.0 / mx;
    is = fma(fma(-mx, is, -127.0), 1.0 / mx, is);
    var word = 0u;
    for (var j = 0u; j < 4u; j++) {
        let q = i32(min(round(is * v[j]), 127.0));
        word |= (u32(q) & 255u) << (8u * j);
    }
    xq[wi] = word;
    if (lid == 0u) {
        var d = 1.0 / is;
        d = fma(d, fma(-is, d, 1.0), d);
        xd[t * nb + b] = d;
    }
}
