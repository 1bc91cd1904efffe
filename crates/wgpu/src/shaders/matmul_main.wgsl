// Y[t][y_off + row] = W[row] . X[t] for a prefill chunk as a tiled product: a workgroup of 256 takes
// BM rows x BN tokens, walking the columns in steps of BK (4 chunks of 8): each step its threads
// dequantize the tile's BM x BK weights once (one chunk each, `load8`) and load the BN x BK inputs
// into workgroup memory, then each thread accumulates a 4 x 4 block of outputs from them. Every weight
// is dequantized once per BN tokens (the batched mat-vec: once per 4). Sums run over the columns in
// order, unlike the mat-vec's (a long step's rows are not decode rows bit for bit; short steps keep
// the mat-vec). A grouped product's tile lies in one group (the host checks group_rows % BM == 0).
const BM: u32 = 64u;
const BN: u32 = 64u;
const BK: u32 = 32u;
const WG: u32 = 256u;
var<workgroup> ws: array<vec4<f32>, 512>;   // BK x BM / 4: [k][rows 4r..4r+3]
var<workgroup> xs: array<vec4<f32>, 512>;   // BK x BN / 4: [k][tokens 4t..4t+3]

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    load_prelude(lid);
    let row0 = (wid.x + wid.y * p.wg_x) * BM;
    let t0 = wid.z * BN;
    let ntok = step.ntok;
    // Uniform exits only: every thread reaches the barriers.
    if (row0 >= p.rows || t0 >= ntok) { return; }
    let nchunks = p.cols / 8u;
    let nks = (nchunks + 3u) / 4u;
    // Loading: thread lid dequantizes chunk lid % 4 of tile row lid / 4 and loads the same 8 columns
    // of tile token lid / 4.
    let lr = lid / 4u;
    let lc = lid % 4u;
    let wrow = row0 + lr;
    let rb = p.w_off + min(wrow, p.rows - 1u) * p.row_bytes;
    let xbase = p.x_off4 + select(0u, (p.y_off + row0) / max(p.group_rows, 1u) * p.group_x4, p.group_rows != 0u);
    let xt = t0 + lr;
    let xrow = xbase + min(xt, ntok - 1u) * p.x_stride4;
    // Computing: rows 4 * (lid / 16) .., tokens 4 * (lid % 16) .. of the tile.
    let tr = lid / 16u;
    let tt = lid % 16u;
    var acc: array<vec4<f32>, 4>;
    for (var ks = 0u; ks < nks; ks++) {
        let c = ks * 4u + lc;
        var wv = W8(vec4<f32>(0.0), vec4<f32>(0.0));
        var xa = vec4<f32>(0.0);
        var xb = vec4<f32>(0.0);
        if (c < nchunks) {
            if (wrow < p.rows) { wv = load8(rb, c); }
            if (xt < ntok) {
                xa = x[xrow + 2u * c];
                xb = x[xrow + 2u * c + 1u];
            }
        }
        let k0 = lc * 8u;
        let wi = lr / 4u;
        let wc = lr % 4u;
        ws[(k0 + 0u) * 16u + wi][wc] = wv.a.x;
        ws[(k0 + 1u) * 16u + wi][wc] = wv.a.y;
        ws[(k0 + 2u) * 16u + wi][wc] = wv.a.z;
        ws[(k0 + 3u) * 16u + wi][wc] = wv.a.w;
        ws[(k0 + 4u) * 16u + wi][wc] = wv.b.x;
        ws[(k0 + 5u) * 16u + wi][wc] = wv.b.y;
        ws[(k0 + 6u) * 16u + wi][wc] = wv.b.z;
        ws[(k0 + 7u) * 16u + wi][wc] = wv.b.w;
        xs[(k0 + 0u) * 16u + wi][wc] = xa.x;
        xs[(k0 + 1u) * 16u + wi][wc] = xa.y;
        xs[(k0 + 2u) * 16u + wi][wc] = xa.z;
        xs[(k0 + 3u) * 16u + wi][wc] = xa.w;
        xs[(k0 + 4u) * 16u + wi][wc] = xb.x;
        xs[(k0 + 5u) * 16u + wi][wc] = xb.y;
        xs[(k0 + 6u) * 16u + wi][wc] = xb.z;
        xs[(k0 + 7u) * 16u + wi][wc] = xb.w;
        workgroupBarrier();
        for (var k = 0u; k < BK; k++) {
            let a = ws[k * 16u + tr];
            let b = xs[k * 16u + tt];
            acc[0] += a.x * b;
            acc[1] += a.y * b;
            acc[2] += a.z * b;
            acc[3] += a.w * b;
        }
        workgroupBarrier();
    }
    for (var i = 0u; i < 4u; i++) {
        let row = row0 + tr * 4u + i;
        if (row < p.rows) {
            for (var j = 0u; j < 4u; j++) {
                let t = t0 + tt * 4u + j;
                if (t < ntok) { y[t * p.y_stride + p.y_off + row] = acc[i][j]; }
            }
        }
    }
}
