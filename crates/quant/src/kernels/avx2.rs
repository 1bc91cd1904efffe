//! AVX2 + FMA + F16C kernels (x86-64). Same integer partial sums per block as the scalar
//! reference; float accumulation order differs.
#![cfg(target_arch = "x86_64")]

use core::arch::x86_64::*;

use crate::blocks::*;
use crate::iq2xxs_tables::IQ2XXS_GRID;
use crate::kernels::{act_blocks, check_rows, IQ2_SIGN_MASKS};

#[inline(always)]
pub(crate) fn ld256(p: &[u8; 32]) -> __m256i {
    // SAFETY: `p` is exactly 32 readable bytes; loadu has no alignment requirement.
    unsafe { _mm256_loadu_si256(p.as_ptr() as *const __m256i) }
}

#[inline(always)]
pub(crate) fn ld128(p: &[u8; 16]) -> __m128i {
    // SAFETY: `p` is exactly 16 readable bytes; loadu has no alignment requirement.
    unsafe { _mm_loadu_si128(p.as_ptr() as *const __m128i) }
}

#[inline(always)]
pub(crate) fn a32(s: &[u8], o: usize) -> &[u8; 32] {
    s[o..o + 32].try_into().unwrap()
}

#[inline(always)]
pub(crate) fn a16(s: &[u8], o: usize) -> &[u8; 16] {
    s[o..o + 16].try_into().unwrap()
}

#[inline]
#[target_feature(enable = "avx2,fma")]
pub(crate) fn hsum256(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_movehdup_ps(s));
    _mm_cvtss_f32(s)
}

/// The f16 at `b[o..o + 2]` as f32 by F16C (exact, as `f16_at_fast`), read as a whole 16-byte vector
/// (`b` must hold 16 bytes from `o`): a fresh register, where a 2-byte insert would merge into
/// whatever register the compiler picks (the accumulator, making each block wait for the last).
#[inline]
#[target_feature(enable = "avx2,f16c")]
fn h2f(b: &[u8], o: usize) -> f32 {
    _mm_cvtss_f32(_mm_cvtph_ps(ld128(a16(b, o))))
}

/// Q8_0 row `w` against N activation rows (`a` at 0, stride, 2 stride, ...): each row's sums in
/// the single-row order, so row t of N equals the N = 1 result bit for bit.
#[target_feature(enable = "avx2,fma,f16c")]
fn q8_0_n<const N: usize>(w: &[u8], a: &[u8], stride: usize) -> [f32; N] {
    let mut acc = [_mm256_setzero_ps(); N];
    let pfd = super::kpf();
    check_rows::<N>(a, stride, w.len() / Q8_0_BYTES, Q8_0_BYTES);
    for (b, bw) in w.chunks_exact(Q8_0_BYTES).enumerate() {
        if pfd > 0 {
            super::pf_at(bw, pfd);
        }
        let wv = ld256(a32(bw, 2));
        let aw = _mm256_sign_epi8(wv, wv);
        let dw = h2f(bw, 0);
        let ba = act_blocks::<N>(a, stride, b, Q8_0_BYTES);
        for (acc, ba) in acc.iter_mut().zip(ba) {
            let sa = _mm256_sign_epi8(ld256(a32(ba, 2)), wv);
            let s = _mm256_madd_epi16(_mm256_maddubs_epi16(aw, sa), _mm256_set1_epi16(1));
            *acc = _mm256_fmadd_ps(_mm256_set1_ps(dw * h2f(ba, 0)), _mm256_cvtepi32_ps(s), *acc);
        }
    }
    let mut out = [0f32; N];
    for (o, v) in out.iter_mut().zip(acc) {
        *o = hsum256(v);
    }
    out
}

/// Shuffle masks picking i16 scale 2j (low lane) and 2j+1 (high lane) from a duplicated
/// 8×i16 vector.
#[inline]
#[target_feature(enable = "avx2,fma")]
fn q2k_scale_shuffle(j: usize) -> __m256i {
    let lo = (4 * j) as i8;
    let hi = (4 * j + 2) as i8;
    _mm256_setr_epi8(
        lo, lo + 1, lo, lo + 1, lo, lo + 1, lo, lo + 1, lo, lo + 1, lo, lo + 1, lo, lo + 1, lo, lo + 1,
        hi, hi + 1, hi, hi + 1, hi, hi + 1, hi, hi + 1, hi, hi + 1, hi, hi + 1, hi, hi + 1, hi, hi + 1,
    )
}

/// Per row: the horizontal sum of `acc` minus that of `accm` (the K-quants' scaled sums and mins).
#[inline]
#[target_feature(enable = "avx2,fma")]
fn sums_minus_mins<const N: usize>(acc: &[__m256; N], accm: &[__m256; N]) -> [f32; N] {
    let mut out = [0f32; N];
    for t in 0..N {
        out[t] = hsum256(acc[t]) - hsum256(accm[t]);
    }
    out
}

/// Q2_K row `w` against N Q8_K activation rows (as `q8_0_n`): the 2-bit values and their scales are
/// unpacked once for the N rows.
#[target_feature(enable = "avx2,fma,f16c")]
fn q2_k_n<const N: usize>(w: &[u8], a: &[u8], stride: usize) -> [f32; N] {
    let mut acc = [_mm256_setzero_ps(); N];
    let mut accm = [_mm256_setzero_ps(); N];
    let m3 = _mm256_set1_epi8(3);
    let m4 = _mm_set1_epi8(15);
    let shuf = [q2k_scale_shuffle(0), q2k_scale_shuffle(1), q2k_scale_shuffle(2), q2k_scale_shuffle(3)];
    let pfd = super::kpf();
    check_rows::<N>(a, stride, w.len() / Q2_K_BYTES, Q8_K_BYTES);
    for (b, bw) in w.chunks_exact(Q2_K_BYTES).enumerate() {
        if pfd > 0 {
            super::pf_at(bw, pfd);
            super::pf_at(bw, pfd + 64);
        }
        let ba = act_blocks::<N>(a, stride, b, Q8_K_BYTES);
        let dw = f16_at_fast(bw, 80);
        let mw = f16_at_fast(bw, 82);
        let sc = ld128(a16(bw, 0));
        let mins = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16::<4>(sc), m4));
        for t in 0..N {
            let pm = _mm256_madd_epi16(mins, ld256(a32(ba[t], 4 + QK_K)));
            let dmin = mw * f32_at(ba[t], 0);
            accm[t] = _mm256_fmadd_ps(_mm256_set1_ps(dmin), _mm256_cvtepi32_ps(pm), accm[t]);
        }
        let sc16 = _mm256_cvtepu8_epi16(_mm_and_si128(sc, m4));
        let mut isum = [_mm256_setzero_si256(); N];
        for h in 0..2 {
            let sv = if h == 0 {
                _mm256_permute2x128_si256::<0x00>(sc16, sc16)
            } else {
                _mm256_permute2x128_si256::<0x11>(sc16, sc16)
            };
            let q = ld256(a32(bw, 16 + 32 * h));
            let qv = [
                _mm256_and_si256(q, m3),
                _mm256_and_si256(_mm256_srli_epi16::<2>(q), m3),
                _mm256_and_si256(_mm256_srli_epi16::<4>(q), m3),
                _mm256_and_si256(_mm256_srli_epi16::<6>(q), m3),
            ];
            let sj = [
                _mm256_shuffle_epi8(sv, shuf[0]),
                _mm256_shuffle_epi8(sv, shuf[1]),
                _mm256_shuffle_epi8(sv, shuf[2]),
                _mm256_shuffle_epi8(sv, shuf[3]),
            ];
            let q8 = 4 + 128 * h;
            for (t, isum) in isum.iter_mut().enumerate() {
                let p0 = _mm256_madd_epi16(_mm256_maddubs_epi16(qv[0], ld256(a32(ba[t], q8))), sj[0]);
                let p1 = _mm256_madd_epi16(_mm256_maddubs_epi16(qv[1], ld256(a32(ba[t], q8 + 32))), sj[1]);
                let p2 = _mm256_madd_epi16(_mm256_maddubs_epi16(qv[2], ld256(a32(ba[t], q8 + 64))), sj[2]);
                let p3 = _mm256_madd_epi16(_mm256_maddubs_epi16(qv[3], ld256(a32(ba[t], q8 + 96))), sj[3]);
                *isum = _mm256_add_epi32(*isum, _mm256_add_epi32(_mm256_add_epi32(p0, p1), _mm256_add_epi32(p2, p3)));
            }
        }
        for t in 0..N {
            let d = dw * f32_at(ba[t], 0);
            acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(isum[t]), acc[t]);
        }
    }
    sums_minus_mins(&acc, &accm)
}

/// Q4_K row `w` against N Q8_K activation rows (as `q8_0_n`): nibbles, scales and mins unpacked
/// once for the N rows.
#[target_feature(enable = "avx2,fma,f16c")]
fn q4_k_n<const N: usize>(w: &[u8], a: &[u8], stride: usize) -> [f32; N] {
    let mut acc = [_mm256_setzero_ps(); N];
    let mut accm = [_mm256_setzero_ps(); N];
    let m4 = _mm256_set1_epi8(15);
    let pfd = super::kpf();
    check_rows::<N>(a, stride, w.len() / Q4_K_BYTES, Q8_K_BYTES);
    for (b, bw) in w.chunks_exact(Q4_K_BYTES).enumerate() {
        if pfd > 0 {
            super::pf_at(bw, pfd);
            super::pf_at(bw, pfd + 64);
            super::pf_at(bw, pfd + 128);
        }
        let ba = act_blocks::<N>(a, stride, b, Q8_K_BYTES);
        let dw = f16_at_fast(bw, 0);
        let mw = f16_at_fast(bw, 2);
        // 6-bit scales/mins unpacked with word ops: bytes 0..3 of `sc`/`mn` are sub-blocks 0..3.
        let u0 = u32_at(bw, 4);
        let u1 = u32_at(bw, 8);
        let u2 = u32_at(bw, 12);
        let sc = (u0 & 0x3f3f_3f3f) as u64 | ((((u2 & 0x0f0f_0f0f) | (((u0 >> 6) & 0x0303_0303) << 4)) as u64) << 32);
        let mn = (u1 & 0x3f3f_3f3f) as u64 | (((((u2 >> 4) & 0x0f0f_0f0f) | (((u1 >> 6) & 0x0303_0303) << 4)) as u64) << 32);
        let m16 = _mm_cvtepu8_epi16(_mm_cvtsi64_si128(mn as i64));
        for t in 0..N {
            let bs = ld256(a32(ba[t], 4 + QK_K));
            // Sum adjacent bsum pairs (the two 16-halves of each 32-sub-block) -> 8 i16.
            let bs8 = _mm_hadd_epi16(_mm256_castsi256_si128(bs), _mm256_extracti128_si256::<1>(bs));
            let pm = _mm256_castsi128_si256(_mm_madd_epi16(m16, bs8));
            let pm = _mm256_inserti128_si256::<1>(pm, _mm_setzero_si128());
            let dmin = mw * f32_at(ba[t], 0);
            accm[t] = _mm256_fmadd_ps(_mm256_set1_ps(dmin), _mm256_cvtepi32_ps(pm), accm[t]);
        }
        let sc = sc.to_le_bytes();
        let mut isum = [_mm256_setzero_si256(); N];
        for j in 0..4 {
            let q = ld256(a32(bw, 16 + 32 * j));
            let lo = _mm256_and_si256(q, m4);
            let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(q), m4);
            let s0 = _mm256_set1_epi16(sc[2 * j] as i16);
            let s1 = _mm256_set1_epi16(sc[2 * j + 1] as i16);
            for (t, isum) in isum.iter_mut().enumerate() {
                let p0 = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, ld256(a32(ba[t], 4 + 64 * j))), s0);
                let p1 = _mm256_madd_epi16(_mm256_maddubs_epi16(hi, ld256(a32(ba[t], 4 + 64 * j + 32))), s1);
                *isum = _mm256_add_epi32(*isum, _mm256_add_epi32(p0, p1));
            }
        }
        for t in 0..N {
            let d = dw * f32_at(ba[t], 0);
            acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(isum[t]), acc[t]);
        }
    }
    sums_minus_mins(&acc, &accm)
}

/// IQ2_XXS row `w` against N Q8_K activation rows (as `q8_0_n`): the grid and sign vectors of a
/// group are built once for the N rows.
#[target_feature(enable = "avx2,fma,f16c")]
fn iq2_xxs_n<const N: usize>(w: &[u8], a: &[u8], stride: usize) -> [f32; N] {
    let mut acc = [_mm256_setzero_ps(); N];
    let pfd = super::kpf();
    check_rows::<N>(a, stride, w.len() / IQ2_XXS_BYTES, Q8_K_BYTES);
    for (b, bw) in w.chunks_exact(IQ2_XXS_BYTES).enumerate() {
        if pfd > 0 {
            super::pf_at(bw, pfd);
            super::pf_at(bw, pfd + 64);
        }
        let ba = act_blocks::<N>(a, stride, b, Q8_K_BYTES);
        let mut isum = [_mm256_setzero_si256(); N];
        for g in 0..8 {
            let a0 = u32_at(bw, 2 + 8 * g);
            let a1 = u32_at(bw, 6 + 8 * g);
            let grid = _mm256_set_epi64x(
                IQ2XXS_GRID[(a0 >> 24) as usize] as i64,
                IQ2XXS_GRID[((a0 >> 16) & 255) as usize] as i64,
                IQ2XXS_GRID[((a0 >> 8) & 255) as usize] as i64,
                IQ2XXS_GRID[(a0 & 255) as usize] as i64,
            );
            let signs = _mm256_set_epi64x(
                IQ2_SIGN_MASKS[((a1 >> 21) & 127) as usize] as i64,
                IQ2_SIGN_MASKS[((a1 >> 14) & 127) as usize] as i64,
                IQ2_SIGN_MASKS[((a1 >> 7) & 127) as usize] as i64,
                IQ2_SIGN_MASKS[(a1 & 127) as usize] as i64,
            );
            let ls = _mm256_set1_epi16((2 * (a1 >> 28) + 1) as i16);
            for (t, isum) in isum.iter_mut().enumerate() {
                let q8 = _mm256_sign_epi8(ld256(a32(ba[t], 4 + 32 * g)), signs);
                let p = _mm256_maddubs_epi16(grid, q8);
                *isum = _mm256_add_epi32(*isum, _mm256_madd_epi16(p, ls));
            }
        }
        let dw = h2f(bw, 0);
        for t in 0..N {
            let d = dw * f32_at(ba[t], 0) * 0.125;
            acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(isum[t]), acc[t]);
        }
    }
    let mut out = [0f32; N];
    for (o, v) in out.iter_mut().zip(acc) {
        *o = hsum256(v);
    }
    out
}

#[target_feature(enable = "avx2,fma,f16c")]
fn f32_impl(w: &[u8], x: &[f32]) -> f32 {
    let n = x.len();
    let mut acc = [_mm256_setzero_ps(); 4];
    let mut i = 0;
    while i + 32 <= n {
        for k in 0..4 {
            let wv = ldps_u8(&w[4 * (i + 8 * k)..4 * (i + 8 * k) + 32]);
            let xv = ldps(&x[i + 8 * k..i + 8 * k + 8]);
            acc[k] = _mm256_fmadd_ps(wv, xv, acc[k]);
        }
        i += 32;
    }
    while i + 8 <= n {
        acc[0] = _mm256_fmadd_ps(ldps_u8(&w[4 * i..4 * i + 32]), ldps(&x[i..i + 8]), acc[0]);
        i += 8;
    }
    let s = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
    let mut r = hsum256(s);
    while i < n {
        r += f32_at(w, 4 * i) * x[i];
        i += 1;
    }
    r
}

#[inline(always)]
fn ldps(x: &[f32]) -> __m256 {
    assert!(x.len() >= 8);
    // SAFETY: asserted at least 8 readable f32s; loadu has no alignment requirement.
    unsafe { _mm256_loadu_ps(x.as_ptr()) }
}

#[inline]
#[target_feature(enable = "avx2,fma")]
fn ldps_u8(w: &[u8]) -> __m256 {
    _mm256_castsi256_ps(ld256(w[..32].try_into().unwrap()))
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn ld_f16x8(w: &[u8]) -> __m256 {
    _mm256_cvtph_ps(ld128(w[..16].try_into().unwrap()))
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn ld_bf16x8(w: &[u8]) -> __m256 {
    let v = _mm256_cvtepu16_epi32(ld128(w[..16].try_into().unwrap()));
    _mm256_castsi256_ps(_mm256_slli_epi32::<16>(v))
}

macro_rules! half_dot {
    ($name:ident, $load:ident, $scalar:ident) => {
        #[target_feature(enable = "avx2,fma,f16c")]
        fn $name(w: &[u8], x: &[f32]) -> f32 {
            let n = x.len();
            let mut acc = [_mm256_setzero_ps(); 4];
            let mut i = 0;
            while i + 32 <= n {
                for k in 0..4 {
                    let o = i + 8 * k;
                    acc[k] = _mm256_fmadd_ps($load(&w[2 * o..2 * o + 16]), ldps(&x[o..o + 8]), acc[k]);
                }
                i += 32;
            }
            while i + 8 <= n {
                acc[0] = _mm256_fmadd_ps($load(&w[2 * i..2 * i + 16]), ldps(&x[i..i + 8]), acc[0]);
                i += 8;
            }
            let s = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
            let mut r = hsum256(s);
            while i < n {
                r += $scalar(w, 2 * i) * x[i];
                i += 1;
            }
            r
        }
    };
}
half_dot!(f16_impl, ld_f16x8, f16_at);
half_dot!(bf16_impl, ld_bf16x8, bf16_at);

entry!(Avx2, dot_f32, f32_impl, [f32]);
entry!(Avx2, dot_f16, f16_impl, [f32]);
entry!(Avx2, dot_bf16, bf16_impl, [f32]);
entry_n!(Avx2, dot_q8_0_q8_0, rows_q8_0_q8_0, q8_0_n);
entry_n!(Avx2, dot_iq2_xxs_q8_k, rows_iq2_xxs_q8_k, iq2_xxs_n);
entry_n!(Avx2, dot_q2_k_q8_k, rows_q2_k_q8_k, q2_k_n);
entry_n!(Avx2, dot_q4_k_q8_k, rows_q4_k_q8_k, q4_k_n);
