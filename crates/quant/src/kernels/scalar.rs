//! Portable scalar dot products: the reference the SIMD kernels are tested against.
//! Integer partial sums per block are exact; only the f32 accumulation across blocks rounds.

use crate::blocks::*;
use crate::iq2xxs_tables::{IQ2XXS_GRID, KSIGNS_IQ2XS};

/// Q8_0 weight row · Q8_0 activation row (both `nb` blocks of 34 bytes).
pub fn dot_q8_0_q8_0(w: &[u8], a: &[u8]) -> f32 {
    let mut sum = 0f32;
    for (bw, ba) in w.chunks_exact(Q8_0_BYTES).zip(a.chunks_exact(Q8_0_BYTES)) {
        let mut s = 0i32;
        for l in 0..QK8_0 {
            s += (bw[2 + l] as i8 as i32) * (ba[2 + l] as i8 as i32);
        }
        sum += s as f32 * (f16_at(bw, 0) * f16_at(ba, 0));
    }
    sum
}

#[inline(always)]
fn q8k_parts(a: &[u8]) -> (f32, &[u8]) {
    (f32_at(a, 0), &a[4..4 + QK_K])
}

#[inline(always)]
pub(crate) fn q8k_bsum(a: &[u8], k: usize) -> i32 {
    i16::from_le_bytes([a[4 + QK_K + 2 * k], a[4 + QK_K + 2 * k + 1]]) as i32
}

/// Q2_K weight row · Q8_K activation row.
pub fn dot_q2_k_q8_k(w: &[u8], a: &[u8]) -> f32 {
    let mut sum = 0f32;
    for (bw, ba) in w.chunks_exact(Q2_K_BYTES).zip(a.chunks_exact(Q8_K_BYTES)) {
        let (da, q8) = q8k_parts(ba);
        let scales = &bw[0..16];
        let qs = &bw[16..80];
        let d = f16_at(bw, 80) * da;
        let dmin = f16_at(bw, 82) * da;
        let mut summ = 0i32;
        for k in 0..16 {
            summ += (scales[k] >> 4) as i32 * q8k_bsum(ba, k);
        }
        let mut isum = 0i32;
        for h in 0..2 {
            for j in 0..4 {
                for half in 0..2 {
                    let mut s = 0i32;
                    for l in 16 * half..16 * half + 16 {
                        let q = ((qs[32 * h + l] >> (2 * j)) & 3) as i32;
                        s += q * (q8[128 * h + 32 * j + l] as i8 as i32);
                    }
                    isum += (scales[8 * h + 2 * j + half] & 15) as i32 * s;
                }
            }
        }
        sum += d * isum as f32 - dmin * summ as f32;
    }
    sum
}

/// Q4_K weight row · Q8_K activation row.
pub fn dot_q4_k_q8_k(w: &[u8], a: &[u8]) -> f32 {
    let mut sum = 0f32;
    for (bw, ba) in w.chunks_exact(Q4_K_BYTES).zip(a.chunks_exact(Q8_K_BYTES)) {
        let (da, q8) = q8k_parts(ba);
        let d = f16_at(bw, 0) * da;
        let dmin = f16_at(bw, 2) * da;
        let scales = &bw[4..16];
        let qs = &bw[16..144];
        let mut isum = 0i32;
        let mut summ = 0i32;
        for j in 0..4 {
            let (s0, m0) = q4k_scale_min(2 * j, scales);
            let (s1, m1) = q4k_scale_min(2 * j + 1, scales);
            let (mut p0, mut p1) = (0i32, 0i32);
            for l in 0..32 {
                let q = qs[32 * j + l];
                p0 += (q & 15) as i32 * (q8[64 * j + l] as i8 as i32);
                p1 += (q >> 4) as i32 * (q8[64 * j + 32 + l] as i8 as i32);
            }
            isum += s0 as i32 * p0 + s1 as i32 * p1;
            summ += m0 as i32 * (q8k_bsum(ba, 4 * j) + q8k_bsum(ba, 4 * j + 1))
                + m1 as i32 * (q8k_bsum(ba, 4 * j + 2) + q8k_bsum(ba, 4 * j + 3));
        }
        sum += d * isum as f32 - dmin * summ as f32;
    }
    sum
}

/// IQ2_XXS weight row · Q8_K activation row.
pub fn dot_iq2_xxs_q8_k(w: &[u8], a: &[u8]) -> f32 {
    let mut sum = 0f32;
    for (bw, ba) in w.chunks_exact(IQ2_XXS_BYTES).zip(a.chunks_exact(Q8_K_BYTES)) {
        let (da, q8) = q8k_parts(ba);
        let d = f16_at(bw, 0) * da * 0.125;
        let mut isum = 0i32;
        for g in 0..8 {
            let a0 = u32_at(bw, 2 + 8 * g);
            let a1 = u32_at(bw, 6 + 8 * g);
            let mut s = 0i32;
            for l in 0..4 {
                let grid = IQ2XXS_GRID[((a0 >> (8 * l)) & 255) as usize].to_le_bytes();
                let signs = KSIGNS_IQ2XS[((a1 >> (7 * l)) & 127) as usize];
                for j in 0..8 {
                    let v = grid[j] as i32 * (q8[32 * g + 8 * l + j] as i8 as i32);
                    s += if signs & (1 << j) != 0 { -v } else { v };
                }
            }
            isum += (2 * (a1 >> 28) as i32 + 1) * s;
        }
        sum += d * isum as f32;
    }
    sum
}

/// F32 weight row · f32 activations.
pub fn dot_f32(w: &[u8], x: &[f32]) -> f32 {
    w.chunks_exact(4).zip(x).map(|(c, &v)| f32_at(c, 0) * v).sum()
}

/// F16 weight row · f32 activations.
pub fn dot_f16(w: &[u8], x: &[f32]) -> f32 {
    w.chunks_exact(2).zip(x).map(|(c, &v)| f16_at(c, 0) * v).sum()
}

/// BF16 weight row · f32 activations.
pub fn dot_bf16(w: &[u8], x: &[f32]) -> f32 {
    w.chunks_exact(2).zip(x).map(|(c, &v)| bf16_at(c, 0) * v).sum()
}
