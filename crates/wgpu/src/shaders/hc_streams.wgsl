// A token's streams in registers, for the HC entry and the output head (modules built per shape:
// N streams of E, C = ceil(E / WG) columns a thread; both bind the streams as `x`). Thread lid holds
// columns lid, lid + WG, ... of every stream, loaded at once so the loads overlap instead of waiting
// in turn; the kernels collapse them from there without reading the streams again.
fn load_streams(lid: u32, xb: u32) -> array<f32, N * C> {
    var xr: array<f32, N * C>;
    for (var m = 0u; m < C; m++) {
        let j = lid + m * WG;
        if (j < E) {
            for (var s = 0u; s < N; s++) { xr[s * C + m] = x[xb + s * E + j]; }
        }
    }
    return xr;
}

// 1 / rms of the token's flat streams (the workgroup's N x E values).
fn flat_inv_rms(lid: u32, xr: ptr<function, array<f32, N * C>>, eps: f32) -> f32 {
    var ss = 0.0;
    for (var i = 0u; i < N * C; i++) { ss += (*xr)[i] * (*xr)[i]; }
    return 1.0 / sqrt(wg_sum(lid, ss) / f32(N * E) + eps);
}

// The thread's columns of sum_s w[s] X[s] into yr; returns 1 / rms of the collapsed row.
fn collapse(lid: u32, xr: ptr<function, array<f32, N * C>>, w: array<f32, 8>, yr: ptr<function, array<f32, C>>, eps: f32) -> f32 {
    var ss = 0.0;
    for (var m = 0u; m < C; m++) {
        var acc = 0.0;
        for (var s = 0u; s < N; s++) { acc += w[s] * (*xr)[s * C + m]; }
        (*yr)[m] = acc;
        ss += acc * acc;
    }
    return 1.0 / sqrt(wg_sum(lid, ss) / f32(E) + eps);
}
