// y[t][y_off + row] = W[row] . x[t] for RW rows and TB tokens per workgroup (TB = 1: mat-vec, > 1:
// batched). WG threads per workgroup (a shape constant, like TB and RW); for each of its rows thread i
// takes chunks i, i + WG, ... (8 weights each, dequantized once and used for every token of the tile),
// then the workgroup reduces (REDUCE_FN). Every row is summed in the same order whatever RW and TB are
// (prefill rows equal decode steps bit for bit); several rows a workgroup share the activations and
// the loader's setup.
var<workgroup> red: array<f32, WG * NO>;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32 SG_PARAMS) {
    load_prelude(lid);
    let row0 = (wid.x + wid.y * p.wg_x) * RW;
    let t0 = wid.z * TB;
    let ntok = select(1u, step.ntok, TB > 1u);
    // Uniform exits only: every thread reaches the barriers of the reduction.
    if (row0 >= p.rows || t0 >= ntok) { return; }
    let nt = min(TB, ntok - t0);
    let nr = min(RW, p.rows - row0);
    let nchunks = p.cols / 8u;
    // Where each row's inputs start (a grouped product's rows read their group's part of the row).
    var xb: array<u32, RW>;
    for (var r = 0u; r < RW; r++) {
        xb[r] = p.x_off4 + select(0u, (p.y_off + row0 + r) / max(p.group_rows, 1u) * p.group_x4, p.group_rows != 0u);
    }
    var acc: array<f32, NO>;
    for (var g = lid; g < nchunks; g += WG) {
        for (var r = 0u; r < nr; r++) {
            let wv = load8(p.w_off + (row0 + r) * p.row_bytes, g);
            for (var t = 0u; t < nt; t++) {
                let xi = xb[r] + (t0 + t) * p.x_stride4 + 2u * g;
                acc[r * TB + t] += dot(wv.a, x[xi]) + dot(wv.b, x[xi + 1u]);
            }
        }
    }
    REDUCE_CALL
    if (lid < nr * TB) {
        let r = lid / TB;
        let t = lid % TB;
        if (t < nt) {
            y[(t0 + t) * p.y_stride + p.y_off + row0 + r] = red[lid * WG];
        }
    }
}
