// y[t][y_off + row] = W[row] . x[t]. A workgroup of WG threads takes RW = (WG / SEG) x R rows and TB
// tokens (TB = 1: mat-vec, > 1: batched); each segment of SEG threads takes R rows, its thread
// `lane` the units lane, lane + SEG, ... of them (UNIT values: a quant block or group), the
// activations of a unit loaded once for the R rows. Then seg_reduce. A row sums in the same order
// whatever R and TB (decode rows equal batched rows bit for bit).
const RW: u32 = (WG / SEG) * R;

// Where row `row`'s inputs start in an activation row (a grouped product's rows read their group's part).
fn group_x(row: u32) -> u32 {
    return p.x_off4 + select(0u, (p.y_off + row) / max(p.group_rows, 1u) * p.group_x4, p.group_rows != 0u);
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    load_prelude(lid);
    let row0 = (wid.x + wid.y * p.wg_x) * RW;
    let t0 = wid.z * TB;
    let ntok = select(1u, step.ntok, TB > 1u);
    // Uniform exits only: every thread reaches the barriers of the reduction.
    if (row0 >= p.rows || t0 >= ntok) { return; }
    let nt = min(TB, ntok - t0);
    let r0 = row0 + (lid / SEG) * R;
    var acc: array<f32, NS>;
    var xs: array<vec4<f32>, XV>;
    for (var u = lid % SEG; u < p.cols / UNIT; u += SEG) {
        for (var t = 0u; t < TB; t++) {
            if (t >= nt) { break; }
            for (var r = 0u; r < R; r++) {
                let row = r0 + r;
                if (row >= p.rows) { break; }
                // A thread's rows are consecutive: their inputs change only where a group starts.
                if (r == 0u || (p.group_rows != 0u && (p.y_off + row) % p.group_rows == 0u)) {
                    let xb = group_x(row) + (t0 + t) * p.x_stride4;
                    for (var i = 0u; i < XV; i++) { xs[i] = x[xb + xv_at(u, i)]; }
                }
                acc[r * TB + t] += dotu(p.w_off + row * p.row_bytes, u, &xs);
            }
        }
    }
    seg_partials(lid, acc);
    for (var o = lid; o < RW * TB; o += WG) {
        let row = row0 + o / TB;
        let t = o % TB;
        if (row < p.rows && t < nt) {
            y[(t0 + t) * p.y_stride + p.y_off + row] = seg_total(o);
        }
    }
}
