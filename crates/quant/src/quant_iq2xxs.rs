//! IQ2_XXS quantizer: our own search (not ggml's algorithm, so outputs differ from ggml's).
//!
//! Per 32-element group: signs are taken from the data (if a sub-group of 8 has an odd number
//! of negatives, the least important element's sign is flipped, since the format stores only
//! even-parity patterns); then a group scale and the four best lattice points are found by a
//! brute-force weighted search over 256 points for a range of candidate scales, refined by a
//! weighted least-squares scale. The 8 group scales are then coded as 4-bit `ls` against the
//! block's f16 `d` (group scale = d·(2·ls+1)/8) and points re-chosen for the coded scale.

use crate::blocks::*;
use crate::iq2xxs_tables::IQ2XXS_GRID_CONST;

const fn grid_f32() -> [[f32; 8]; 256] {
    let mut out = [[0f32; 8]; 256];
    let mut i = 0;
    while i < 256 {
        let mut j = 0;
        while j < 8 {
            out[i][j] = ((IQ2XXS_GRID_CONST[i] >> (8 * j)) & 255) as f32;
            j += 1;
        }
        i += 1;
    }
    out
}
static GRID: [[f32; 8]; 256] = grid_f32();

/// Best lattice point for targets `t` (already sign-folded) at scale `s`: (index, weighted error).
fn best_point(t: &[f32], w: &[f32], s: f32) -> (usize, f32) {
    let mut best = (0usize, f32::INFINITY);
    for (i, g) in GRID.iter().enumerate() {
        let mut e = 0f32;
        for j in 0..8 {
            let d = t[j] - s * g[j];
            e += w[j] * d * d;
        }
        if e < best.1 {
            best = (i, e);
        }
    }
    best
}

/// Quantize one 32-group: returns (scale, point indices, 7-bit sign codes).
fn quantize_group(x: &[f32], w: &[f32]) -> (f32, [usize; 4], [u32; 4]) {
    let mut t = [0f32; 32];
    let mut signs = [0u32; 4];
    for k in 0..4 {
        let mut bits = 0u32;
        let mut imin = 0usize;
        let mut vmin = f32::INFINITY;
        for j in 0..8 {
            let v = x[8 * k + j];
            t[8 * k + j] = v.abs();
            if v < 0.0 {
                bits |= 1 << j;
            }
            let imp = w[8 * k + j] * v * v;
            if imp < vmin {
                vmin = imp;
                imin = j;
            }
        }
        if bits.count_ones() % 2 == 1 {
            // Flip the least important element: it will be reconstructed with the other sign.
            bits ^= 1 << imin;
            t[8 * k + imin] = -t[8 * k + imin];
        }
        // Bit 7 is implied by parity; if the flipped element is 7, bits 0..6 still encode it.
        signs[k] = bits & 127;
    }
    let tmax = t.iter().fold(0f32, |m, &v| m.max(v));
    if tmax == 0.0 {
        return (0.0, [0; 4], signs);
    }
    let mut best = (f32::INFINITY, 0f32, [0usize; 4]);
    for step in 0..=16 {
        // Candidate scales: the largest target lands between grid levels 25 and 43·1.3.
        let s = tmax / 43.0 * (0.7 + 0.05 * step as f32);
        let mut err = 0f32;
        let mut idx = [0usize; 4];
        for k in 0..4 {
            let (i, e) = best_point(&t[8 * k..8 * k + 8], &w[8 * k..8 * k + 8], s);
            idx[k] = i;
            err += e;
        }
        // Least-squares refit of the scale for these points.
        let (mut num, mut den) = (0f32, 0f32);
        for k in 0..4 {
            for j in 0..8 {
                let g = GRID[idx[k]][j];
                num += w[8 * k + j] * t[8 * k + j] * g;
                den += w[8 * k + j] * g * g;
            }
        }
        let s2 = if den > 0.0 && num > 0.0 { num / den } else { s };
        let mut err2 = 0f32;
        for k in 0..4 {
            for j in 0..8 {
                let d = t[8 * k + j] - s2 * GRID[idx[k]][j];
                err2 += w[8 * k + j] * d * d;
            }
        }
        let (e, sc) = if err2 < err { (err2, s2) } else { (err, s) };
        if e < best.0 {
            best = (e, sc, idx);
        }
    }
    (best.1, best.2, signs)
}

/// Quantize one row (length multiple of 256) to IQ2_XXS; `imatrix` (per column of the row,
/// same length as `x`) weights the error like ggml's importance matrix.
pub fn quantize_row_iq2_xxs(x: &[f32], out: &mut [u8], imatrix: Option<&[f32]>) {
    for (bi, (xb, y)) in x.chunks_exact(QK_K).zip(out.chunks_exact_mut(IQ2_XXS_BYTES)).enumerate() {
        let sumx2: f32 = xb.iter().map(|v| v * v).sum();
        let sigma2 = 2.0 * sumx2 / QK_K as f32;
        let mut w = [0f32; QK_K];
        for i in 0..QK_K {
            w[i] = match imatrix {
                Some(im) => im[bi * QK_K + i] * (sigma2 + xb[i] * xb[i]).sqrt(),
                None => 0.25 * sigma2 + xb[i] * xb[i],
            };
        }
        let mut groups = Vec::with_capacity(8);
        for g in 0..8 {
            groups.push(quantize_group(&xb[32 * g..32 * g + 32], &w[32 * g..32 * g + 32]));
        }
        y.fill(0);
        let max_s = groups.iter().fold(0f32, |m, gr| m.max(gr.0));
        if max_s <= 0.0 {
            continue;
        }
        y[0..2].copy_from_slice(&f16_bits(max_s * 8.0 / 31.0));
        let d = f16_at(y, 0);
        if d == 0.0 {
            y.fill(0);
            continue;
        }
        for (g, (s, idx, signs)) in groups.iter().enumerate() {
            let ls = nearest_int((8.0 * s / d - 1.0) / 2.0).clamp(0, 15) as u32;
            let sq = d * (2 * ls + 1) as f32 / 8.0;
            // Re-choose points for the coded scale (targets re-folded as in quantize_group).
            let mut idx2 = *idx;
            let xs = &xb[32 * g..32 * g + 32];
            for k in 0..4 {
                let mut t = [0f32; 8];
                let full = crate::iq2xxs_tables::KSIGNS_IQ2XS[signs[k] as usize];
                for j in 0..8 {
                    let a = xs[8 * k + j];
                    t[j] = if full & (1 << j) != 0 { -a } else { a };
                }
                idx2[k] = best_point(&t, &w[32 * g + 8 * k..32 * g + 8 * k + 8], sq).0;
            }
            let a0 = idx2[0] as u32 | (idx2[1] as u32) << 8 | (idx2[2] as u32) << 16 | (idx2[3] as u32) << 24;
            let a1 = signs[0] | signs[1] << 7 | signs[2] << 14 | signs[3] << 21 | ls << 28;
            y[2 + 8 * g..6 + 8 * g].copy_from_slice(&a0.to_le_bytes());
            y[6 + 8 * g..10 + 8 * g].copy_from_slice(&a1.to_le_bytes());
        }
    }
}

/// Quantize `rows = src.len() / n_per_row` rows to IQ2_XXS with an optional per-column
/// importance matrix (`imatrix.len() == n_per_row`).
pub fn quantize_iq2_xxs(src: &[f32], n_per_row: usize, imatrix: Option<&[f32]>) -> Vec<u8> {
    assert!(n_per_row % QK_K == 0 && src.len() % n_per_row == 0);
    let rb = n_per_row / QK_K * IQ2_XXS_BYTES;
    let mut out = vec![0u8; src.len() / n_per_row * rb];
    for (xr, o) in src.chunks_exact(n_per_row).zip(out.chunks_exact_mut(rb)) {
        quantize_row_iq2_xxs(xr, o, imatrix);
    }
    out
}
