//! NEON + dotprod kernels (aarch64: Apple M1 and later, Neoverse N1 / V1 / V2 such as Grace and
//! Graviton 2+). Same integer partial sums per block as the scalar reference (signed 8-bit dots by
//! `sdot`, scaled per sub-block in i32); float accumulation order differs.
//!
//! `sdot` and the f16 widening are written as inline assembly: their intrinsics are not stable in
//! Rust yet. Every other operation is a `core::arch::aarch64` intrinsic.
#![cfg(target_arch = "aarch64")]

use core::arch::aarch64::*;
use core::arch::asm;

use crate::blocks::*;
use crate::iq2xxs_tables::IQ2XXS_GRID;
use crate::kernels::{act_blocks, check_rows, IQ2_SIGN_MASKS};

/// 16 bytes of `s` at `o` as signed bytes.
#[inline(always)]
fn ld16(s: &[u8], o: usize) -> int8x16_t {
    let p: &[u8; 16] = s[o..o + 16].try_into().unwrap();
    // SAFETY: `p` is exactly 16 readable bytes; vld1q has no alignment requirement.
    unsafe { vld1q_s8(p.as_ptr() as *const i8) }
}

/// 16 bytes of `s` at `o` as unsigned bytes.
#[inline(always)]
fn ld16u(s: &[u8], o: usize) -> uint8x16_t {
    let p: &[u8; 16] = s[o..o + 16].try_into().unwrap();
    // SAFETY: as `ld16`.
    unsafe { vld1q_u8(p.as_ptr()) }
}

/// 4 f32 of `x` at `o`.
#[inline(always)]
fn ldf(x: &[f32], o: usize) -> float32x4_t {
    let p: &[f32; 4] = x[o..o + 4].try_into().unwrap();
    // SAFETY: `p` is exactly 4 readable f32; vld1q has no alignment requirement.
    unsafe { vld1q_f32(p.as_ptr()) }
}

/// acc + the four 4-byte signed dots of `a` and `b` (one per i32 lane).
#[inline]
#[target_feature(enable = "dotprod")]
fn sdot(acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t {
    let mut acc = acc;
    // SAFETY: sdot reads and writes only these registers; this function is only reachable from
    // kernels handed out after `dotprod` was detected at run time (Kernels::for_isa).
    unsafe {
        asm!("sdot {acc:v}.4s, {a:v}.16b, {b:v}.16b", acc = inout(vreg) acc, a = in(vreg) a, b = in(vreg) b,
             options(pure, nomem, nostack, preserves_flags));
    }
    acc
}

/// 32 signed-byte pairs (two 16-byte halves each) dotted, as 4 i32 lanes.
#[inline]
#[target_feature(enable = "dotprod")]
fn dot32(w0: int8x16_t, w1: int8x16_t, a: &[u8], o: usize) -> int32x4_t {
    sdot(sdot(vdupq_n_s32(0), w0, ld16(a, o)), w1, ld16(a, o + 16))
}

/// 4 f16 as f32 (exact).
#[inline]
#[target_feature(enable = "neon")]
fn f16x4(h: [u16; 4]) -> float32x4_t {
    // SAFETY: `h` is 4 readable u16; vld1 has no alignment requirement.
    let h = unsafe { vld1_u16(h.as_ptr()) };
    let f: float32x4_t;
    // SAFETY: fcvtl (base AdvSIMD) reads `h` and writes `f`, nothing else.
    unsafe {
        asm!("fcvtl {f:v}.4s, {h:v}.4h", h = in(vreg) h, f = out(vreg) f, options(pure, nomem, nostack, preserves_flags));
    }
    f
}

/// Q8_0 row `w` against N activation rows (`a` at 0, stride, 2 stride, ...): each row's sums in
/// the single-row order, so row t of N equals the N = 1 result bit for bit. Four blocks at a time:
/// their integer sums in one vector (pairwise adds), their scales converted together, one
/// multiply-add; the weights and their scales are loaded once for the N rows.
#[target_feature(enable = "dotprod")]
fn q8_0_n<const N: usize>(w: &[u8], a: &[u8], stride: usize) -> [f32; N] {
    const QUAD: usize = 4 * Q8_0_BYTES;
    let nb = w.len() / Q8_0_BYTES;
    let nq = nb / 4;
    let scales = |x: &[u8]| [0, 1, 2, 3].map(|b| u16_at(x, b * Q8_0_BYTES));
    // Also covers the QUAD-sized blocks below (nq * QUAD <= nb * Q8_0_BYTES).
    check_rows::<N>(a, stride, nb, Q8_0_BYTES);
    let mut acc = [vdupq_n_f32(0.0); N];
    for q in 0..nq {
        let bw = &w[q * QUAD..][..QUAD];
        let wv = [0, 1, 2, 3].map(|b| [ld16(bw, b * Q8_0_BYTES + 2), ld16(bw, b * Q8_0_BYTES + 18)]);
        let dw = f16x4(scales(bw));
        let bq = act_blocks::<N>(a, stride, q, QUAD);
        for (acc, ba) in acc.iter_mut().zip(bq) {
            let mut s = [vdupq_n_s32(0); 4];
            for (b, sb) in s.iter_mut().enumerate() {
                *sb = dot32(wv[b][0], wv[b][1], ba, b * Q8_0_BYTES + 2);
            }
            let s = vpaddq_s32(vpaddq_s32(s[0], s[1]), vpaddq_s32(s[2], s[3]));
            let d = vmulq_f32(dw, f16x4(scales(ba)));
            *acc = vfmaq_f32(*acc, vcvtq_f32_s32(s), d);
        }
    }
    let mut out = [0f32; N];
    for (t, o) in out.iter_mut().enumerate() {
        let mut sum = vaddvq_f32(acc[t]);
        for b in 4 * nq..nb {
            let bw = &w[b * Q8_0_BYTES..][..Q8_0_BYTES];
            let ba = act_blocks::<N>(a, stride, b, Q8_0_BYTES)[t];
            let s = vaddvq_s32(dot32(ld16(bw, 2), ld16(bw, 18), ba, 2));
            sum += s as f32 * (f16_at_fast(bw, 0) * f16_at_fast(ba, 0));
        }
        *o = sum;
    }
    out
}

/// The Q8_K activation block's 16 bsums, pairwise: element k is bsum[2k] + bsum[2k + 1].
#[inline(always)]
fn q8k_bsums(ba: &[u8]) -> (int16x8_t, int16x8_t) {
    let p: &[u8; 32] = ba[4 + QK_K..4 + QK_K + 32].try_into().unwrap();
    // SAFETY: `p` is exactly 32 readable bytes (16 little-endian i16); no alignment requirement.
    unsafe { (vld1q_s16(p.as_ptr() as *const i16), vld1q_s16(p.as_ptr().add(16) as *const i16)) }
}

/// Q2_K row `w` against N Q8_K activation rows (as `q8_0_n`): the 2-bit values and their scales are
/// unpacked once for the N rows.
#[target_feature(enable = "dotprod")]
fn q2_k_n<const N: usize>(w: &[u8], a: &[u8], stride: usize) -> [f32; N] {
    let m3 = vdupq_n_u8(3);
    let mut sum = [0f32; N];
    check_rows::<N>(a, stride, w.len() / Q2_K_BYTES, Q8_K_BYTES);
    for (b, bw) in w.chunks_exact(Q2_K_BYTES).enumerate() {
        let ba = act_blocks::<N>(a, stride, b, Q8_K_BYTES);
        let dw = f16_at_fast(bw, 80);
        let mw = f16_at_fast(bw, 82);
        let sc = ld16u(bw, 0);
        // Mins (high nibbles), widened for the products with the 16 bsums.
        let mins = vshrq_n_u8::<4>(sc);
        let m0 = vreinterpretq_s16_u16(vmovl_u8(vget_low_u8(mins)));
        let m1 = vreinterpretq_s16_u16(vmovl_high_u8(mins));
        // Scales (low nibbles) of each 16-value sub-block.
        let mut s = [0i32; 16];
        for (k, v) in s.iter_mut().enumerate() {
            *v = (bw[k] & 15) as i32;
        }
        let mut iv = [vdupq_n_s32(0); N];
        for h in 0..2 {
            let mut q0 = ld16u(bw, 16 + 32 * h);
            let mut q1 = ld16u(bw, 16 + 32 * h + 16);
            for j in 0..4 {
                let t0 = vreinterpretq_s8_u8(vandq_u8(q0, m3));
                let t1 = vreinterpretq_s8_u8(vandq_u8(q1, m3));
                let o = 4 + 128 * h + 32 * j;
                for (t, iv) in iv.iter_mut().enumerate() {
                    let p0 = sdot(vdupq_n_s32(0), t0, ld16(ba[t], o));
                    let p1 = sdot(vdupq_n_s32(0), t1, ld16(ba[t], o + 16));
                    *iv = vmlaq_n_s32(*iv, p0, s[8 * h + 2 * j]);
                    *iv = vmlaq_n_s32(*iv, p1, s[8 * h + 2 * j + 1]);
                }
                q0 = vshrq_n_u8::<2>(q0);
                q1 = vshrq_n_u8::<2>(q1);
            }
        }
        for t in 0..N {
            let da = f32_at(ba[t], 0);
            let (b0, b1) = q8k_bsums(ba[t]);
            let pm = vmlal_high_s16(vmull_s16(vget_low_s16(m0), vget_low_s16(b0)), m0, b0);
            let pm = vmlal_high_s16(vmlal_s16(pm, vget_low_s16(m1), vget_low_s16(b1)), m1, b1);
            let summ = vaddvq_s32(pm);
            sum[t] += dw * da * vaddvq_s32(iv[t]) as f32 - mw * da * summ as f32;
        }
    }
    sum
}

/// Q4_K row `w` against N Q8_K activation rows (as `q8_0_n`): nibbles, scales and mins unpacked
/// once for the N rows.
#[target_feature(enable = "dotprod")]
fn q4_k_n<const N: usize>(w: &[u8], a: &[u8], stride: usize) -> [f32; N] {
    let m4 = vdupq_n_u8(15);
    let mut sum = [0f32; N];
    check_rows::<N>(a, stride, w.len() / Q4_K_BYTES, Q8_K_BYTES);
    for (b, bw) in w.chunks_exact(Q4_K_BYTES).enumerate() {
        let ba = act_blocks::<N>(a, stride, b, Q8_K_BYTES);
        let dw = f16_at_fast(bw, 0);
        let mw = f16_at_fast(bw, 2);
        let scales = &bw[4..16];
        let mut sc = [0i32; 8];
        let mut mn = [0i16; 8];
        for j in 0..8 {
            let (s, m) = q4k_scale_min(j, scales);
            sc[j] = s as i32;
            mn[j] = m as i16;
        }
        // SAFETY: `mn` is 8 readable i16.
        let mv = unsafe { vld1q_s16(mn.as_ptr()) };
        let mut iv = [vdupq_n_s32(0); N];
        for j in 0..4 {
            let q0 = ld16u(bw, 16 + 32 * j);
            let q1 = ld16u(bw, 16 + 32 * j + 16);
            let lo = [vreinterpretq_s8_u8(vandq_u8(q0, m4)), vreinterpretq_s8_u8(vandq_u8(q1, m4))];
            let hi = [vreinterpretq_s8_u8(vshrq_n_u8::<4>(q0)), vreinterpretq_s8_u8(vshrq_n_u8::<4>(q1))];
            for (t, iv) in iv.iter_mut().enumerate() {
                let pl = dot32(lo[0], lo[1], ba[t], 4 + 64 * j);
                let ph = dot32(hi[0], hi[1], ba[t], 4 + 64 * j + 32);
                *iv = vmlaq_n_s32(*iv, pl, sc[2 * j]);
                *iv = vmlaq_n_s32(*iv, ph, sc[2 * j + 1]);
            }
        }
        for t in 0..N {
            let da = f32_at(ba[t], 0);
            // Sub-block j's min times bsum[2j] + bsum[2j + 1].
            let (b0, b1) = q8k_bsums(ba[t]);
            let bp = vpaddq_s16(b0, b1);
            let summ = vaddvq_s32(vmlal_high_s16(vmull_s16(vget_low_s16(mv), vget_low_s16(bp)), mv, bp));
            sum[t] += dw * da * vaddvq_s32(iv[t]) as f32 - mw * da * summ as f32;
        }
    }
    sum
}

/// Grid points `i0`, `i1` (8 bytes each, all positive) with the signs of sign indices `s0`, `s1`.
#[inline]
#[target_feature(enable = "dotprod")]
fn iq2_pair(i0: u32, i1: u32, s0: u32, s1: u32) -> int8x16_t {
    let g = vcombine_s8(vcreate_s8(IQ2XXS_GRID[i0 as usize]), vcreate_s8(IQ2XXS_GRID[i1 as usize]));
    let s = vcombine_s8(vcreate_s8(IQ2_SIGN_MASKS[s0 as usize]), vcreate_s8(IQ2_SIGN_MASKS[s1 as usize]));
    // The signs go on the grid bytes (at most 43), never on the activations (-128 has no negation).
    vmulq_s8(g, s)
}

/// IQ2_XXS row `w` against N Q8_K activation rows (as `q8_0_n`): a group's signed grid points are
/// built once for the N rows.
#[target_feature(enable = "dotprod")]
fn iq2_xxs_n<const N: usize>(w: &[u8], a: &[u8], stride: usize) -> [f32; N] {
    let mut sum = [0f32; N];
    check_rows::<N>(a, stride, w.len() / IQ2_XXS_BYTES, Q8_K_BYTES);
    for (b, bw) in w.chunks_exact(IQ2_XXS_BYTES).enumerate() {
        let ba = act_blocks::<N>(a, stride, b, Q8_K_BYTES);
        let mut iv = [vdupq_n_s32(0); N];
        for g in 0..8 {
            let a0 = u32_at(bw, 2 + 8 * g);
            let a1 = u32_at(bw, 6 + 8 * g);
            let w0 = iq2_pair(a0 & 255, (a0 >> 8) & 255, a1 & 127, (a1 >> 7) & 127);
            let w1 = iq2_pair((a0 >> 16) & 255, a0 >> 24, (a1 >> 14) & 127, (a1 >> 21) & 127);
            let ls = (2 * (a1 >> 28) + 1) as i32;
            for (t, iv) in iv.iter_mut().enumerate() {
                *iv = vmlaq_n_s32(*iv, dot32(w0, w1, ba[t], 4 + 32 * g), ls);
            }
        }
        let dw = f16_at_fast(bw, 0);
        for t in 0..N {
            let d = dw * f32_at(ba[t], 0) * 0.125;
            sum[t] += d * vaddvq_s32(iv[t]) as f32;
        }
    }
    sum
}

/// 8 f16 (16 bytes of `w` at `o`) as two f32 vectors.
#[inline]
#[target_feature(enable = "neon")]
fn ld_f16x8(w: &[u8], o: usize) -> (float32x4_t, float32x4_t) {
    let h = vreinterpretq_u16_u8(ld16u(w, o));
    let lo: float32x4_t;
    let hi: float32x4_t;
    // SAFETY: fcvtl/fcvtl2 (base AdvSIMD) read `h` and write two registers, nothing else.
    unsafe {
        asm!("fcvtl {lo:v}.4s, {h:v}.4h", "fcvtl2 {hi:v}.4s, {h:v}.8h", h = in(vreg) h, lo = out(vreg) lo, hi = out(vreg) hi,
             options(pure, nomem, nostack, preserves_flags));
    }
    (lo, hi)
}

/// 8 bf16 (16 bytes of `w` at `o`) as two f32 vectors: the bits shifted into the high half.
#[inline]
#[target_feature(enable = "neon")]
fn ld_bf16x8(w: &[u8], o: usize) -> (float32x4_t, float32x4_t) {
    let h = vreinterpretq_u16_u8(ld16u(w, o));
    (vreinterpretq_f32_u32(vshll_n_u16::<16>(vget_low_u16(h))), vreinterpretq_f32_u32(vshll_high_n_u16::<16>(h)))
}

/// 8 f32 (32 bytes of `w` at `o`) as two vectors.
#[inline]
#[target_feature(enable = "neon")]
fn ld_f32x8(w: &[u8], o: usize) -> (float32x4_t, float32x4_t) {
    (vreinterpretq_f32_u8(ld16u(w, o)), vreinterpretq_f32_u8(ld16u(w, o + 16)))
}

macro_rules! float_dot {
    ($name:ident, $load:ident, $bytes:expr, $scalar:expr) => {
        #[target_feature(enable = "neon")]
        fn $name(w: &[u8], x: &[f32]) -> f32 {
            let n = x.len();
            let mut acc = [vdupq_n_f32(0.0); 4];
            let mut i = 0;
            while i + 16 <= n {
                let (a, b) = $load(w, $bytes * i);
                let (c, d) = $load(w, $bytes * (i + 8));
                acc[0] = vfmaq_f32(acc[0], a, ldf(x, i));
                acc[1] = vfmaq_f32(acc[1], b, ldf(x, i + 4));
                acc[2] = vfmaq_f32(acc[2], c, ldf(x, i + 8));
                acc[3] = vfmaq_f32(acc[3], d, ldf(x, i + 12));
                i += 16;
            }
            while i + 8 <= n {
                let (a, b) = $load(w, $bytes * i);
                acc[0] = vfmaq_f32(acc[0], a, ldf(x, i));
                acc[1] = vfmaq_f32(acc[1], b, ldf(x, i + 4));
                i += 8;
            }
            let mut r = vaddvq_f32(vaddq_f32(vaddq_f32(acc[0], acc[1]), vaddq_f32(acc[2], acc[3])));
            while i < n {
                r += $scalar(w, $bytes * i) * x[i];
                i += 1;
            }
            r
        }
    };
}
float_dot!(f32_impl, ld_f32x8, 4, f32_at);
float_dot!(f16_impl, ld_f16x8, 2, f16_at);
float_dot!(bf16_impl, ld_bf16x8, 2, bf16_at);

entry!(Neon, dot_f32, f32_impl, [f32]);
entry!(Neon, dot_f16, f16_impl, [f32]);
entry!(Neon, dot_bf16, bf16_impl, [f32]);
entry_n!(Neon, dot_q8_0_q8_0, rows_q8_0_q8_0, q8_0_n);
entry_n!(Neon, dot_iq2_xxs_q8_k, rows_iq2_xxs_q8_k, iq2_xxs_n);
entry_n!(Neon, dot_q2_k_q8_k, rows_q2_k_q8_k, q2_k_n);
entry_n!(Neon, dot_q4_k_q8_k, rows_q4_k_q8_k, q4_k_n);
