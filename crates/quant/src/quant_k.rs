//! Q2_K and Q4_K quantizers: ggml's reference algorithms (`quantize_row_q{2,4}_K_ref`, no
//! importance matrix), re-implemented from their description: per sub-block a weighted
//! least-squares fit of (scale, min) searched over a few candidate inverse scales, then the
//! sub-block scales/mins themselves quantized to 4 (Q2_K) or 6 (Q4_K) bits against f16 super-scales.

use crate::blocks::*;

/// Affine fit x ≈ scale·L − min_neg with L ∈ [0, nmax]; returns (scale, −min) and fills `l`.
/// `rmin`, `rdelta`, `nstep`: candidate inverse scales (nmax + rmin + rdelta·i)/(max − min).
#[allow(clippy::too_many_arguments)]
fn make_qkx2_quants(
    nmax: i32,
    x: &[f32],
    weights: &[f32],
    l: &mut [u8],
    rmin: f32,
    rdelta: f32,
    nstep: i32,
    use_mad: bool,
) -> (f32, f32) {
    let n = x.len();
    let mut laux = [0u8; 32];
    let mut min = x[0];
    let mut max = x[0];
    let mut sum_w = weights[0];
    let mut sum_x = sum_w * x[0];
    for i in 1..n {
        if x[i] < min {
            min = x[i];
        }
        if x[i] > max {
            max = x[i];
        }
        let w = weights[i];
        sum_w += w;
        sum_x += w * x[i];
    }
    if min > 0.0 {
        min = 0.0;
    }
    if max == min {
        l[..n].fill(0);
        return (0.0, -min);
    }
    let mut iscale = nmax as f32 / (max - min);
    let mut scale = 1.0 / iscale;
    let mut best_error = 0f32;
    for i in 0..n {
        let q = nearest_int(iscale * (x[i] - min)).clamp(0, nmax);
        l[i] = q as u8;
        let diff = scale * l[i] as f32 + min - x[i];
        let diff = if use_mad { diff.abs() } else { diff * diff };
        best_error += weights[i] * diff;
    }
    if nstep < 1 {
        return (scale, -min);
    }
    for is in 0..=nstep {
        iscale = (rmin + rdelta * is as f32 + nmax as f32) / (max - min);
        let (mut sum_l, mut sum_l2, mut sum_xl) = (0f32, 0f32, 0f32);
        for i in 0..n {
            let q = nearest_int(iscale * (x[i] - min)).clamp(0, nmax);
            laux[i] = q as u8;
            let w = weights[i];
            let lf = q as f32;
            sum_l += w * lf;
            sum_l2 += w * lf * lf;
            sum_xl += w * lf * x[i];
        }
        let det = sum_w * sum_l2 - sum_l * sum_l;
        if det > 0.0 {
            let mut this_scale = (sum_w * sum_xl - sum_x * sum_l) / det;
            let mut this_min = (sum_l2 * sum_x - sum_l * sum_xl) / det;
            if this_min > 0.0 {
                this_min = 0.0;
                this_scale = sum_xl / sum_l2;
            }
            let mut mad = 0f32;
            for i in 0..n {
                let diff = this_scale * laux[i] as f32 + this_min - x[i];
                let diff = if use_mad { diff.abs() } else { diff * diff };
                mad += weights[i] * diff;
            }
            if mad < best_error {
                l[..n].copy_from_slice(&laux[..n]);
                best_error = mad;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    (scale, -min)
}

/// Q2_K: 16 sub-blocks of 16, 2-bit quants, 4-bit sub-scales and sub-mins.
pub fn quantize_row_q2_k(x: &[f32], out: &mut [u8]) {
    const Q4SCALE: f32 = 15.0;
    for (x, y) in x.chunks_exact(QK_K).zip(out.chunks_exact_mut(Q2_K_BYTES)) {
        let mut l = [0u8; QK_K];
        let mut scales = [0f32; 16];
        let mut mins = [0f32; 16];
        let mut weights = [0f32; 16];
        let (mut max_scale, mut max_min) = (0f32, 0f32);
        for j in 0..16 {
            let xs = &x[16 * j..16 * j + 16];
            for (w, v) in weights.iter_mut().zip(xs) {
                *w = v.abs();
            }
            let (s, m) = make_qkx2_quants(3, xs, &weights, &mut l[16 * j..16 * j + 16], -0.5, 0.1, 15, true);
            scales[j] = s;
            mins[j] = m;
            if s > max_scale {
                max_scale = s;
            }
            if m > max_min {
                max_min = m;
            }
        }
        y.fill(0);
        if max_scale > 0.0 {
            let iscale = Q4SCALE / max_scale;
            for j in 0..16 {
                y[j] = nearest_int(iscale * scales[j]) as u8;
            }
            y[80..82].copy_from_slice(&f16_bits(max_scale / Q4SCALE));
        }
        if max_min > 0.0 {
            let iscale = Q4SCALE / max_min;
            for j in 0..16 {
                y[j] |= (nearest_int(iscale * mins[j]) << 4) as u8;
            }
            y[82..84].copy_from_slice(&f16_bits(max_min / Q4SCALE));
        }
        let dd = f16_at(y, 80);
        let dm = f16_at(y, 82);
        for j in 0..16 {
            let d = dd * (y[j] & 15) as f32;
            if d == 0.0 {
                continue;
            }
            let m = dm * (y[j] >> 4) as f32;
            for ii in 0..16 {
                l[16 * j + ii] = nearest_int((x[16 * j + ii] + m) / d).clamp(0, 3) as u8;
            }
        }
        for h in 0..2 {
            for k in 0..32 {
                let b = 128 * h + k;
                y[16 + 32 * h + k] = l[b] | (l[b + 32] << 2) | (l[b + 64] << 4) | (l[b + 96] << 6);
            }
        }
    }
}

/// Q4_K: 8 sub-blocks of 32, 4-bit quants, 6-bit sub-scales and sub-mins.
pub fn quantize_row_q4_k(x: &[f32], out: &mut [u8]) {
    for (x, y) in x.chunks_exact(QK_K).zip(out.chunks_exact_mut(Q4_K_BYTES)) {
        let mut l = [0u8; QK_K];
        let mut scales = [0f32; 8];
        let mut mins = [0f32; 8];
        let mut weights = [0f32; 32];
        let (mut max_scale, mut max_min) = (0f32, 0f32);
        for j in 0..8 {
            let xs = &x[32 * j..32 * j + 32];
            let sum_x2: f32 = xs.iter().fold(0f32, |s, v| s + v * v);
            let av_x = (sum_x2 / 32.0).sqrt();
            for (w, v) in weights.iter_mut().zip(xs) {
                *w = av_x + v.abs();
            }
            let (s, m) = make_qkx2_quants(15, xs, &weights, &mut l[32 * j..32 * j + 32], -1.0, 0.1, 20, false);
            scales[j] = s;
            mins[j] = m;
            if s > max_scale {
                max_scale = s;
            }
            if m > max_min {
                max_min = m;
            }
        }
        let inv_scale = if max_scale > 0.0 { 63.0 / max_scale } else { 0.0 };
        let inv_min = if max_min > 0.0 { 63.0 / max_min } else { 0.0 };
        y.fill(0);
        let sc = &mut y[4..16];
        for j in 0..8 {
            let ls = (nearest_int(inv_scale * scales[j]) as u8).min(63);
            let lm = (nearest_int(inv_min * mins[j]) as u8).min(63);
            if j < 4 {
                sc[j] = ls;
                sc[j + 4] = lm;
            } else {
                sc[j + 4] = (ls & 0xF) | ((lm & 0xF) << 4);
                sc[j - 4] |= (ls >> 4) << 6;
                sc[j] |= (lm >> 4) << 6;
            }
        }
        y[0..2].copy_from_slice(&f16_bits(max_scale / 63.0));
        y[2..4].copy_from_slice(&f16_bits(max_min / 63.0));
        let dd = f16_at(y, 0);
        let dmm = f16_at(y, 2);
        for j in 0..8 {
            let (s, m) = q4k_scale_min(j, &y[4..16]);
            let d = dd * s as f32;
            if d == 0.0 {
                continue;
            }
            let dm = dmm * m as f32;
            for ii in 0..32 {
                l[32 * j + ii] = nearest_int((x[32 * j + ii] + dm) / d).clamp(0, 15) as u8;
            }
        }
        for j in 0..4 {
            for k in 0..32 {
                y[16 + 32 * j + k] = l[64 * j + k] | (l[64 * j + 32 + k] << 4);
            }
        }
    }
}
