// Compressor frontier update for the step's tokens (as ds4_model::compressor::push, one token after
// the other): token t (position pos + t, slot s = pos % ratio) stores its kv row and score
// (gate + ape[s]) into state row s (ratio 4: row 4 + s, rows 0..3 hold the previous window); when
// the window closes ((pos + 1) % ratio == 0) the pooled row c = (pos + 1) / ratio - 1 is written to
// `out` (raw: normed / roped / QAT'd by kv_row afterwards). Pooling per channel: softmax of the
// scores over the window's rows, -inf scores (rows never written) count for nothing. Ratio 4 pools
// the previous window's channels [0, d) with the current window's channels [d, 2d), then the current
// window becomes the previous one. Thread j owns output channel j and state channels j (and d + j),
// so the threads never share state and the sequential order of tokens is kept per thread.
struct Params { d: u32, width: u32, ratio: u32, pad: u32 }
struct Step { ntok: u32, pos: u32, pad0: u32, pad1: u32 }
@group(0) @binding(0) var<storage, read> kv_in: array<f32>;
@group(0) @binding(1) var<storage, read> gate: array<f32>;
@group(0) @binding(2) var<storage, read> ape: array<f32>;
@group(0) @binding(3) var<storage, read_write> st_kv: array<f32>;
@group(0) @binding(4) var<storage, read_write> st_sc: array<f32>;
@group(0) @binding(5) var<storage, read_write> out: array<f32>;
@group(0) @binding(6) var<uniform> p: Params;
@group(0) @binding(7) var<uniform> step: Step;

// Scores at or below this are the -inf of rows never written.
const NEG: f32 = -3.4028235e38;

// Pooled value of candidates k in [k0, k1) at channel ch of the state, plus [k2, k3) at channel ch2.
fn pool(k0: u32, k1: u32, ch: u32, k2: u32, k3: u32, ch2: u32) -> f32 {
    let w = p.width;
    var m = NEG;
    for (var k = k0; k < k1; k++) { m = max(m, st_sc[k * w + ch]); }
    for (var k = k2; k < k3; k++) { m = max(m, st_sc[k * w + ch2]); }
    if (m <= NEG) { return 0.0; }
    var den = 0.0;
    var num = 0.0;
    for (var k = k0; k < k1; k++) {
        let s = st_sc[k * w + ch];
        if (s > NEG) {
            let e = exp(s - m);
            den += e;
            num += e * st_kv[k * w + ch];
        }
    }
    for (var k = k2; k < k3; k++) {
        let s = st_sc[k * w + ch2];
        if (s > NEG) {
            let e = exp(s - m);
            den += e;
            num += e * st_kv[k * w + ch2];
        }
    }
    return num / den;
}

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let j = gid.x;
    let d = p.d;
    let w = p.width;
    let r = p.ratio;
    if (j >= d) { return; }
    let overlap = r == 4u;
    for (var t = 0u; t < step.ntok; t++) {
        let pos = step.pos + t;
        let slot = pos % r;
        let row = select(slot, r + slot, overlap);
        st_kv[row * w + j] = kv_in[t * w + j];
        st_sc[row * w + j] = gate[t * w + j] + ape[slot * w + j];
        if (overlap) {
            st_kv[row * w + d + j] = kv_in[t * w + d + j];
            st_sc[row * w + d + j] = gate[t * w + d + j] + ape[slot * w + d + j];
        }
        if ((pos + 1u) % r != 0u) { continue; }
        let c = (pos + 1u) / r - 1u;
        if (overlap) {
            out[c * d + j] = pool(0u, 4u, j, 4u, 8u, d + j);
            for (var k = 0u; k < 4u; k++) {
                st_kv[k * w + j] = st_kv[(k + 4u) * w + j];
                st_sc[k * w + j] = st_sc[(k + 4u) * w + j];
                st_kv[k * w + d + j] = st_kv[(k + 4u) * w + d + j];
                st_sc[k * w + d + j] = st_sc[(k + 4u) * w + d + j];
            }
        } else {
            out[c * d + j] = pool(0u, r, j, 0u, 0u, j);
        }
    }
}
