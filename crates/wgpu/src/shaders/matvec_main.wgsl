// y[t][y_off + row] = W[row] . x[t] for TB tokens per workgroup (TB = 1: mat-vec, > 1: batched).
// One workgroup of 64 per row; thread i takes chunks i, i + 64, ... (8 weights each, dequantized
// once and used for every token of the tile), then the workgroup reduces (REDUCE_FN).
const WG: u32 = 64u;
var<workgroup> red: array<f32, 256>;  // WG * TB (TB <= 4)

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32 SG_PARAMS) {
    load_prelude(lid);
    let row = wid.x + wid.y * p.wg_x;
    if (row >= p.rows) { return; }
    let t0 = wid.z * TB;
    let ntok = select(1u, step.ntok, TB > 1u);
    if (t0 >= ntok) { return; }
    let nt = min(TB, ntok - t0);
    let rb = p.w_off + row * p.row_bytes;
    let nchunks = p.cols / 8u;
    var acc: array<f32, TB>;
    for (var g = lid; g < nchunks; g += WG) {
        let wv = load8(rb, g);
        for (var t = 0u; t < nt; t++) {
            let xi = p.x_off4 + (t0 + t) * p.x_stride4 + 2u * g;
            acc[t] += dot(wv.a, x[xi]) + dot(wv.b, x[xi + 1u]);
        }
    }
    REDUCE_CALL
    if (lid == 0u) {
        for (var t = 0u; t < nt; t++) {
            y[(t0 + t) * p.y_stride + p.y_off + row] = red[t * WG];
        }
    }
}
