//! Hyper-connections: collapse the N residual streams into one sub-layer input (with a Sinkhorn-balanced
//! mixing matrix) and expand the sub-layer output back into N streams.
use crate::ops::{rms_norm, sigmoid};

pub const MAX_HC: usize = 8;

/// Per-token mixing coefficients produced by HC-pre and consumed by HC-post.
#[derive(Debug, Clone, Copy)]
pub struct HcMix {
    pub post: [f32; MAX_HC],
    pub comb: [f32; MAX_HC * MAX_HC],
}

impl Default for HcMix {
    fn default() -> Self { Self { post: [0.0; MAX_HC], comb: [0.0; MAX_HC * MAX_HC] } }
}

/// Normalised copy of the flattened streams (input of the mixing projection).
pub fn flat_norm(x: &[f32], flat: &mut [f32], eps: f32) {
    flat.copy_from_slice(x);
    rms_norm(flat, None, eps);
}

/// From the projected mix (`(2+N)·N` values) computes pre weights, post weights and the Sinkhorn matrix,
/// and writes the collapsed sub-layer input `out = Σ_s pre[s]·X[s]`.
pub fn pre_from_mix(
    mix: &[f32],
    scale: &[f32],
    base: &[f32],
    n_hc: usize,
    iters: usize,
    eps: f32,
    x: &[f32],
    out: &mut [f32],
) -> HcMix {
    let n = n_hc;
    let e = out.len();
    let mut m = HcMix::default();
    let mut pre = [0f32; MAX_HC];
    for i in 0..n {
        pre[i] = sigmoid(mix[i] * scale[0] + base[i]) + eps;
        m.post[i] = 2.0 * sigmoid(mix[n + i] * scale[1] + base[n + i]);
    }
    let c = &mut m.comb;
    for r in 0..n {
        for k in 0..n {
            c[r * n + k] = mix[2 * n + r * n + k] * scale[2] + base[2 * n + r * n + k];
        }
    }
    // Row softmax, then eps, then column normalisation; then alternate row/column normalisation.
    for r in 0..n {
        let row = &mut c[r * n..(r + 1) * n];
        let mx = row.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
        let mut s = 0.0;
        for v in row.iter_mut() {
            *v = (*v - mx).exp();
            s += *v;
        }
        for v in row.iter_mut() {
            *v = *v / s + eps;
        }
    }
    col_norm(c, n, eps);
    for _ in 1..iters {
        row_norm(c, n, eps);
        col_norm(c, n, eps);
    }
    out.fill(0.0);
    for s in 0..n {
        let xs = &x[s * e..(s + 1) * e];
        out.iter_mut().zip(xs).for_each(|(o, &v)| *o += pre[s] * v);
    }
    m
}

fn row_norm(c: &mut [f32], n: usize, eps: f32) {
    for r in 0..n {
        let s: f32 = c[r * n..(r + 1) * n].iter().sum::<f32>() + eps;
        c[r * n..(r + 1) * n].iter_mut().for_each(|v| *v /= s);
    }
}

fn col_norm(c: &mut [f32], n: usize, eps: f32) {
    for k in 0..n {
        let s: f32 = (0..n).map(|r| c[r * n + k]).sum::<f32>() + eps;
        (0..n).for_each(|r| c[r * n + k] /= s);
    }
}

/// X'[c] = post[c]·y + Σ_r comb[r][c]·X[r]  (in place over `x`).
pub fn post(m: &HcMix, n_hc: usize, y: &[f32], x: &mut [f32], tmp: &mut [f32]) {
    let e = y.len();
    tmp.copy_from_slice(x);
    for c in 0..n_hc {
        let dst = &mut x[c * e..(c + 1) * e];
        for (j, d) in dst.iter_mut().enumerate() {
            let mut acc = m.post[c] * y[j];
            for r in 0..n_hc {
                acc += m.comb[r * n_hc + c] * tmp[r * e + j];
            }
            *d = acc;
        }
    }
}

/// Output-head collapse: w[s] = sigmoid(m[s]·scale + base[s]) + eps; h = Σ w[s]·X[s].
pub fn head_collapse(mix: &[f32], scale: f32, base: &[f32], eps: f32, x: &[f32], out: &mut [f32]) {
    let e = out.len();
    out.fill(0.0);
    for (s, (&m, &b)) in mix.iter().zip(base).enumerate() {
        let w = sigmoid(m * scale + b) + eps;
        out.iter_mut().zip(&x[s * e..(s + 1) * e]).for_each(|(o, &v)| *o += w * v);
    }
}
