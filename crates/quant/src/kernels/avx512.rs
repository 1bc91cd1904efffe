//! AVX-512 kernels (F/BW/VL/DQ + VNNI, VBMI, BITALG, GFNI). Same integer partial sums per
//! block as the scalar reference; float accumulation order differs. F32/F16/BF16 (bandwidth
//! bound already) reuse the AVX2 code.
//!
//! Activations are assumed to lie in [-127, 127] (true for our Q8_0 and Q8_K quantizers):
//! signs are moved onto the activation by negating it, which would wrap for -128.
#![cfg(target_arch = "x86_64")]

use core::arch::x86_64::*;

use crate::blocks::*;
use crate::iq2xxs_tables::{IQ2XXS_CODES, IQ2XXS_GRID};

pub(crate) use super::avx2::{dot_bf16, dot_f16, dot_f32};

#[inline]
#[target_feature(enable = "avx512f")]
fn ld512(p: &[u8; 64]) -> __m512i {
    // SAFETY: `p` is exactly 64 readable bytes; loadu has no alignment requirement.
    unsafe { _mm512_loadu_si512(p.as_ptr().cast()) }
}

#[inline]
#[target_feature(enable = "avx2")]
fn ld256(p: &[u8; 32]) -> __m256i {
    // SAFETY: `p` is exactly 32 readable bytes; loadu has no alignment requirement.
    unsafe { _mm256_loadu_si256(p.as_ptr().cast()) }
}

#[inline]
#[target_feature(enable = "sse2")]
fn ld128(p: &[u8; 16]) -> __m128i {
    // SAFETY: `p` is exactly 16 readable bytes; loadu has no alignment requirement.
    unsafe { _mm_loadu_si128(p.as_ptr().cast()) }
}

#[inline(always)]
fn a64(s: &[u8], o: usize) -> &[u8; 64] {
    s[o..o + 64].try_into().unwrap()
}

#[inline(always)]
fn a32(s: &[u8], o: usize) -> &[u8; 32] {
    s[o..o + 32].try_into().unwrap()
}

/// Two 32-byte loads joined into one 512-bit vector (lo at bytes 0..32).
#[inline]
#[target_feature(enable = "avx512f,avx2")]
fn ld2x256(lo: &[u8; 32], hi: &[u8; 32]) -> __m512i {
    _mm512_inserti64x4::<1>(_mm512_castsi256_si512(ld256(lo)), ld256(hi))
}

/// Signed×signed 8-bit dot of 64 pairs into 16 i32 lanes (4 products per lane) with VNNI:
/// |w| (as u8, so -128 → 128 is exact) times a with w's sign moved onto a.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
fn dot_i8x64(w: __m512i, a: __m512i) -> __m512i {
    let neg = _mm512_movepi8_mask(w);
    let sa = _mm512_mask_sub_epi8(a, neg, _mm512_setzero_si512(), a);
    _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_abs_epi8(w), sa)
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
fn q8_0_impl(w: &[u8], a: &[u8]) -> f32 {
    let nb = w.len() / Q8_0_BYTES;
    let a = &a[..nb * Q8_0_BYTES];
    // Lanes 0..8 take block scale 0, lanes 8..16 block scale 1.
    let pick = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
    let mut acc0 = _mm512_setzero_ps();
    let mut acc1 = _mm512_setzero_ps();
    let mut pairs = w.chunks_exact(2 * Q8_0_BYTES).zip(a.chunks_exact(2 * Q8_0_BYTES));
    let pfd = super::kpf();
    for (bw, ba) in &mut pairs {
        if pfd > 0 {
            super::pf_at(bw, pfd);
            super::pf_at(bw, pfd + 64);
        }
        let s = dot_i8x64(ld2x256(a32(bw, 2), a32(bw, 36)), ld2x256(a32(ba, 2), a32(ba, 36)));
        let h = u16_at(bw, 0) as u64
            | (u16_at(bw, 34) as u64) << 16
            | (u16_at(ba, 0) as u64) << 32
            | (u16_at(ba, 34) as u64) << 48;
        let f = _mm_cvtph_ps(_mm_cvtsi64_si128(h as i64)); // [dw0, dw1, da0, da1]
        let dd = _mm_mul_ps(f, _mm_movehl_ps(f, f));
        let dv = _mm512_permutexvar_ps(pick, _mm512_castps128_ps512(dd));
        // Alternate accumulators to halve the FMA dependency chain.
        core::mem::swap(&mut acc0, &mut acc1);
        acc0 = _mm512_fmadd_ps(dv, _mm512_cvtepi32_ps(s), acc0);
    }
    let mut r = _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
    if nb % 2 == 1 {
        let o = (nb - 1) * Q8_0_BYTES;
        let (bw, ba) = (&w[o..o + Q8_0_BYTES], &a[o..o + Q8_0_BYTES]);
        let wv = ld256(a32(bw, 2));
        let av = ld256(a32(ba, 2));
        let neg = _mm256_movepi8_mask(wv);
        let sa = _mm256_mask_sub_epi8(av, neg, _mm256_setzero_si256(), av);
        let s = _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_abs_epi8(wv), sa);
        let s128 = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256::<1>(s));
        let s64 = _mm_add_epi32(s128, _mm_unpackhi_epi64(s128, s128));
        let s32 = _mm_add_epi32(s64, _mm_shuffle_epi32::<1>(s64));
        r += _mm_cvtsi128_si32(s32) as f32 * (f16_at_fast(bw, 0) * f16_at_fast(ba, 0));
    }
    r
}

/// Word index vectors for `_mm512_permutexvar_epi16`: word w of vector k takes source word
/// `4k + w/8` (Q2_K: 16 scales, one per 16 elements = 8 maddubs words).
#[inline]
#[target_feature(enable = "avx512f")]
fn q2k_scale_idx(k: i32) -> __m512i {
    let b = 4 * k;
    let p = |j: i32| (b + j) | ((b + j) << 16);
    _mm512_set_epi32(
        p(3), p(3), p(3), p(3), p(2), p(2), p(2), p(2), p(1), p(1), p(1), p(1), p(0), p(0), p(0), p(0),
    )
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,gfni,avx2,fma,f16c")]
fn q2_k_impl(w: &[u8], a: &[u8]) -> f32 {
    let m4 = _mm_set1_epi8(15);
    // Per 256-bit half: GF(2) bit-select matrices taking bit plane (0, 1) or (2, 3) of every
    // byte of the broadcast quants to bits 0..1 (one op instead of shift + and).
    let sel = |j: i64| (1i64 << (2 * j)) << 56 | (1i64 << (2 * j + 1)) << 48;
    let pl01 = _mm512_set_epi64(sel(1), sel(1), sel(1), sel(1), sel(0), sel(0), sel(0), sel(0));
    let pl23 = _mm512_set_epi64(sel(3), sel(3), sel(3), sel(3), sel(2), sel(2), sel(2), sel(2));
    let sidx = [q2k_scale_idx(0), q2k_scale_idx(1), q2k_scale_idx(2), q2k_scale_idx(3)];
    let mut acc = _mm512_setzero_ps();
    let mut accm = _mm256_setzero_ps();
    let pfd = super::kpf();
    for (bw, ba) in w.chunks_exact(Q2_K_BYTES).zip(a.chunks_exact(Q8_K_BYTES)) {
        if pfd > 0 {
            super::pf_at(bw, pfd);
            super::pf_at(bw, pfd + 64);
        }
        let da = _mm_set1_ps(f32_at(ba, 0));
        let dm = _mm_mul_ps(_mm_cvtph_ps(_mm_cvtsi32_si128(u32_at(bw, 80) as i32)), da); // [d, dmin]
        let sc = ld128(bw[0..16].try_into().unwrap());
        let mins = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16::<4>(sc), m4));
        let pm = _mm256_madd_epi16(mins, ld256(a32(ba, 4 + QK_K)));
        accm = _mm256_fmadd_ps(_mm256_broadcastss_ps(_mm_movehdup_ps(dm)), _mm256_cvtepi32_ps(pm), accm);
        let sc16 = _mm512_castsi256_si512(_mm256_cvtepu8_epi16(_mm_and_si128(sc, m4)));
        let mut isum = _mm512_setzero_si512();
        for h in 0..2 {
            // Elements 128h + 32j + l sit in bits 2j of qs[32h + l]: broadcast the 32 bytes to
            // both halves and select each half's own plane j so one vector covers 64 elements.
            let q = _mm512_broadcast_i64x4(ld256(a32(bw, 16 + 32 * h)));
            let w01 = _mm512_gf2p8affine_epi64_epi8::<0>(q, pl01);
            let w23 = _mm512_gf2p8affine_epi64_epi8::<0>(q, pl23);
            let q8 = 4 + 128 * h;
            let p0 = _mm512_maddubs_epi16(w01, ld512(a64(ba, q8)));
            let p1 = _mm512_maddubs_epi16(w23, ld512(a64(ba, q8 + 64)));
            isum = _mm512_dpwssd_epi32(isum, p0, _mm512_permutexvar_epi16(sidx[2 * h], sc16));
            isum = _mm512_dpwssd_epi32(isum, p1, _mm512_permutexvar_epi16(sidx[2 * h + 1], sc16));
        }
        acc = _mm512_fmadd_ps(_mm512_broadcastss_ps(dm), _mm512_cvtepi32_ps(isum), acc);
    }
    _mm512_reduce_add_ps(acc) - {
        let s = _mm_add_ps(_mm256_castps256_ps128(accm), _mm256_extractf128_ps::<1>(accm));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)))
    }
}

/// Word index: words 0..16 take source word 2k, words 16..32 source word 2k+1.
#[inline]
#[target_feature(enable = "avx512f")]
fn pair_idx(lo: i32, hi: i32) -> __m512i {
    let l = lo | (lo << 16);
    let h = hi | (hi << 16);
    _mm512_set_epi32(h, h, h, h, h, h, h, h, l, l, l, l, l, l, l, l)
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
fn q4_k_impl(w: &[u8], a: &[u8]) -> f32 {
    let m4 = _mm512_set1_epi8(15);
    let sidx = [pair_idx(0, 1), pair_idx(2, 3), pair_idx(4, 5), pair_idx(6, 7)];
    let mut acc = _mm512_setzero_ps();
    let mut accm = _mm_setzero_ps();
    let pfd = super::kpf();
    for (bw, ba) in w.chunks_exact(Q4_K_BYTES).zip(a.chunks_exact(Q8_K_BYTES)) {
        if pfd > 0 {
            super::pf_at(bw, pfd);
            super::pf_at(bw, pfd + 64);
            super::pf_at(bw, pfd + 128);
        }
        let da = _mm_set1_ps(f32_at(ba, 0));
        let dm = _mm_mul_ps(_mm_cvtph_ps(_mm_cvtsi32_si128(u32_at(bw, 0) as i32)), da); // [d, dmin]
        // 6-bit scales/mins unpacked with word ops: byte j of `sc`/`mn` is sub-block j.
        let u0 = u32_at(bw, 4);
        let u1 = u32_at(bw, 8);
        let u2 = u32_at(bw, 12);
        let sc = (u0 & 0x3f3f_3f3f) as u64 | ((((u2 & 0x0f0f_0f0f) | (((u0 >> 6) & 0x0303_0303) << 4)) as u64) << 32);
        let mn = (u1 & 0x3f3f_3f3f) as u64 | (((((u2 >> 4) & 0x0f0f_0f0f) | (((u1 >> 6) & 0x0303_0303) << 4)) as u64) << 32);
        let bs = ld256(a32(ba, 4 + QK_K));
        // Sum adjacent bsum pairs (the two 16-halves of each 32-sub-block) → 8 i16.
        let bs8 = _mm_hadd_epi16(_mm256_castsi256_si128(bs), _mm256_extracti128_si256::<1>(bs));
        let pm = _mm_madd_epi16(_mm_cvtepu8_epi16(_mm_cvtsi64_si128(mn as i64)), bs8);
        accm = _mm_fmadd_ps(_mm_permute_ps::<0x55>(dm), _mm_cvtepi32_ps(pm), accm);
        let sc16 = _mm512_castsi128_si512(_mm_cvtepu8_epi16(_mm_cvtsi64_si128(sc as i64)));
        let mut isum = _mm512_setzero_si512();
        for h in 0..2 {
            // qs[64h..64h+64]: low nibbles = sub-blocks 4h, 4h+2; high = 4h+1, 4h+3.
            let q = ld512(a64(bw, 16 + 64 * h));
            let lo = _mm512_and_si512(q, m4);
            let hi = _mm512_and_si512(_mm512_srli_epi16::<4>(q), m4);
            // Reorder to element order: [4h, 4h+1] and [4h+2, 4h+3].
            let w0 = _mm512_shuffle_i64x2::<0x44>(lo, hi);
            let w1 = _mm512_shuffle_i64x2::<0xEE>(lo, hi);
            let p0 = _mm512_maddubs_epi16(w0, ld512(a64(ba, 4 + 128 * h)));
            let p1 = _mm512_maddubs_epi16(w1, ld512(a64(ba, 4 + 128 * h + 64)));
            isum = _mm512_dpwssd_epi32(isum, p0, _mm512_permutexvar_epi16(sidx[2 * h], sc16));
            isum = _mm512_dpwssd_epi32(isum, p1, _mm512_permutexvar_epi16(sidx[2 * h + 1], sc16));
        }
        acc = _mm512_fmadd_ps(_mm512_broadcastss_ps(dm), _mm512_cvtepi32_ps(isum), acc);
    }
    _mm512_reduce_add_ps(acc) - {
        let s = _mm_add_ps(accm, _mm_movehl_ps(accm, accm));
        _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)))
    }
}

/// GF(2) affine matrix for `gf2p8affine`: output bits 0..6 = input bits 0..6, output bit 7 =
/// parity of input bits 0..7 — turns a raw 7-bit IQ2 sign index into its 8-bit sign
/// pattern (the 8th sign makes the number of minus signs even), ignoring input bit 7.
const SIGN_PARITY_MATRIX: i64 = 0x0102_0408_1020_407F;

/// 8 sign bytes per group pair as mask words: returns [u64; 4] where word k's bit 8i+j is the
/// sign of element 8i+j of the block's 64-element chunk k.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi,gfni")]
fn iq2xxs_signs(q: __m512i) -> [u64; 4] {
    // Qword g of q is [a0 (grid indices), a1 (4 × 7 sign bits, 4-bit scale)]: pull the four
    // 7-bit fields at bit offsets 32, 39, 46, 53 into bytes 0..3.
    let ctrl = _mm512_set1_epi64((53 << 24) | (46 << 16) | (39 << 8) | 32);
    let raw = _mm512_multishift_epi64_epi8(ctrl, q);
    let sb = _mm512_gf2p8affine_epi64_epi8::<0>(raw, _mm512_set1_epi64(SIGN_PARITY_MATRIX));
    // Keep bytes 0..3 of each qword: dword g = the 4 sign bytes of group g.
    bytemuck::cast(_mm512_cvtepi64_epi32(sb))
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx512vbmi,gfni,avx2,fma,f16c")]
fn iq2_xxs_impl(w: &[u8], a: &[u8]) -> f32 {
    // Byte gather: dword i (0..16) of the index vector takes q byte 8(i/4) + i%4 (grid index
    // l = i%4 of group i/4); the other three bytes are zeroed by the mask.
    let gidx_lo = _mm512_set_epi32(27, 26, 25, 24, 19, 18, 17, 16, 11, 10, 9, 8, 3, 2, 1, 0);
    let gidx_hi = _mm512_add_epi32(gidx_lo, _mm512_set1_epi32(32));
    let low_byte = 0x1111_1111_1111_1111u64;
    // Per group pair k: words 0..16 take the scale of group 2k (word 4·2k of `ls`), words
    // 16..32 that of group 2k+1.
    let sidx = [pair_idx(0, 4), pair_idx(8, 12), pair_idx(16, 20), pair_idx(24, 28)];
    let one = _mm512_set1_epi64(1);
    let zero = _mm512_setzero_si512();
    let grid = IQ2XXS_GRID.as_ptr() as *const i64;
    let mut acc = _mm512_setzero_ps();
    for (bw, ba) in w.chunks_exact(IQ2_XXS_BYTES).zip(a.chunks_exact(Q8_K_BYTES)) {
        let d = f16_at_fast(bw, 0) * f32_at(ba, 0) * 0.125;
        let q = ld512(a64(bw, 2));
        let i_lo = _mm512_maskz_permutexvar_epi8(low_byte, gidx_lo, q);
        let i_hi = _mm512_maskz_permutexvar_epi8(low_byte, gidx_hi, q);
        let idx = [
            _mm512_castsi512_si256(i_lo),
            _mm512_extracti64x4_epi64::<1>(i_lo),
            _mm512_castsi512_si256(i_hi),
            _mm512_extracti64x4_epi64::<1>(i_hi),
        ];
        let signs = iq2xxs_signs(q);
        // Odd scale 2·(a1 >> 28) + 1 in the low word of qword g.
        let ls = _mm512_or_si512(_mm512_slli_epi64::<1>(_mm512_srli_epi64::<60>(q)), one);
        let mut isum = zero;
        for k in 0..4 {
            // SAFETY: every index is one byte (0..=255) and IQ2XXS_GRID has 256 u64 entries.
            let g = unsafe { _mm512_i32gather_epi64::<8>(idx[k], grid) };
            let av = ld512(a64(ba, 4 + 64 * k));
            let sa = _mm512_mask_sub_epi8(av, signs[k], zero, av);
            let p = _mm512_maddubs_epi16(g, sa);
            isum = _mm512_dpwssd_epi32(isum, p, _mm512_permutexvar_epi16(sidx[k], ls));
        }
        acc = _mm512_fmadd_ps(_mm512_set1_ps(d), _mm512_cvtepi32_ps(isum), acc);
    }
    _mm512_reduce_add_ps(acc)
}

/// f16 → f32 bit pattern with integer ops for normal numbers (exact), else the general path.
#[inline(always)]
fn f16_to_f32_bits(h: u16) -> u32 {
    let h = h as u32;
    let e = h & 0x7c00;
    if e != 0 && e != 0x7c00 {
        ((h & 0x8000) << 16) | (((h & 0x7fff) << 13) + 0x3800_0000)
    } else {
        f16_bits_to_f32(h as u16).to_bits()
    }
}

/// Low / high bytes of the 256 IQ2_XXS grid codes (2 bits per coordinate), for `vpermi2b`.
static IQ2_CODE_BYTES: [[u8; 256]; 2] = {
    let mut t = [[0u8; 256]; 2];
    let mut i = 0;
    while i < 256 {
        t[0][i] = IQ2XXS_CODES[i] as u8;
        t[1][i] = (IQ2XXS_CODES[i] >> 8) as u8;
        i += 1;
    }
    t
};

/// GF(2) affine map of a 2-bit grid code c (input bits 0, 1; higher bits ignored) to its
/// coordinate value 8 ^ (17·c0) ^ (35·c1) = 8, 25, 43 for c = 0, 1, 2 (used with constant 8).
const CODE_VALUE_MATRIX: i64 = 0x0302_0000_0102_0000;

/// IQ2_XXS weight row · Q8_K activation row in the row-transposed layout of
/// [`crate::kernels::q8k_to_row_major_groups`] (chunk k = row k of all 8 groups), which the
/// matvec driver prepares once per call. Every 64-element chunk then has the same lane →
/// group map (dword lanes 2g, 2g+1 = group g), so the four chunks accumulate into one VNNI
/// sum per block and the group scales are applied once; each chunk's grid bytes are one
/// multishift + one GF(2) affine map of the looked-up codes, and its sign mask one
/// bit-shuffle of the decoded sign bytes. No gathers (slow on many x86 cores).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx512vbmi,avx512bitalg,gfni,avx2,fma,f16c")]
fn iq2_xxs_t_impl(w: &[u8], a: &[u8]) -> f32 {
    // Code tables: [lo 0..128, lo 128..256, hi 0..128, hi 128..256] as register pairs.
    let t: [__m512i; 8] = core::array::from_fn(|i| ld512(a64(&IQ2_CODE_BYTES[i / 4], 64 * (i % 4))));
    // Chunk k: byte j of qword g = the 2-bit code of coordinate j of row k: bits 8k + 2j of
    // the low code bytes (j < 4) or 32 + 8k + 2(j - 4) of the high ones.
    let xctrl: [__m512i; 4] = core::array::from_fn(|k| _mm512_set1_epi64(0x2624_2220_0604_0200 + 0x0808_0808_0808_0808 * k as i64));
    let cval = _mm512_set1_epi64(CODE_VALUE_MATRIX);
    // Sign mask of chunk k: bit 8g + j = bit j of sign byte k in qword g of the decoded signs.
    let sctrl: [__m512i; 4] = core::array::from_fn(|k| _mm512_set1_epi64(0x0706_0504_0302_0100 + 0x0808_0808_0808_0808 * k as i64));
    // Scale lanes: dword lane j belongs to group j/2, whose a1 is q dword 2(j/2)+1.
    let lidx = _mm512_set_epi32(15, 15, 13, 13, 11, 11, 9, 9, 7, 7, 5, 5, 3, 3, 1, 1);
    let ctrl = _mm512_set1_epi64((53 << 24) | (46 << 16) | (39 << 8) | 32);
    let parity = _mm512_set1_epi64(SIGN_PARITY_MATRIX);
    let one = _mm512_set1_epi32(1);
    let zero = _mm512_setzero_si512();
    let mut acc = _mm512_setzero_ps();
    let pfd = super::kpf();
    for (bw, ba) in w.chunks_exact(IQ2_XXS_BYTES).zip(a.chunks_exact(Q8_K_BYTES)) {
        if pfd > 0 {
            super::pf_at(bw, pfd);
            super::pf_at(bw, pfd + 64);
        }
        // The activation scale already includes IQ2_XXS's 1/8; the f16 weight scale is
        // widened with integer ops and multiplied after the broadcast, which keeps this off
        // the two vector ports the rest of the loop saturates.
        let d = _mm512_mul_ps(_mm512_castsi512_ps(_mm512_set1_epi32(f16_to_f32_bits(u16_at(bw, 0)) as i32)), _mm512_set1_ps(f32_at(ba, 0)));
        let q = ld512(a64(bw, 2));
        // Low code bytes looked up in place (bytes 8g + l); high code bytes with the indices
        // shifted up to bytes 8g + 4 + l. Qword g of `codes`: [lo(g, 0..4), hi(g, 0..4)].
        let q_hi = _mm512_slli_epi64::<32>(q);
        let lo = _mm512_mask_mov_epi8(
            _mm512_permutex2var_epi8(t[0], q, t[1]),
            _mm512_movepi8_mask(q),
            _mm512_permutex2var_epi8(t[2], q, t[3]),
        );
        let hi = _mm512_mask_mov_epi8(
            _mm512_permutex2var_epi8(t[4], q_hi, t[5]),
            _mm512_movepi8_mask(q_hi),
            _mm512_permutex2var_epi8(t[6], q_hi, t[7]),
        );
        let codes = _mm512_mask_mov_epi8(lo, 0xF0F0_F0F0_F0F0_F0F0, hi);
        // Decoded sign bytes (7 index bits + parity) in bytes 0..3 of qword g.
        let sb = _mm512_gf2p8affine_epi64_epi8::<0>(_mm512_multishift_epi64_epi8(ctrl, q), parity);
        let ls = _mm512_or_si512(_mm512_slli_epi32::<1>(_mm512_srli_epi32::<28>(_mm512_permutexvar_epi32(lidx, q))), one);
        let mut isum = zero;
        for k in 0..4 {
            let g = _mm512_gf2p8affine_epi64_epi8::<8>(_mm512_multishift_epi64_epi8(xctrl[k], codes), cval);
            let av = ld512(a64(ba, 4 + 64 * k));
            let sa = _mm512_mask_sub_epi8(av, _mm512_bitshuffle_epi64_mask(sb, sctrl[k]), zero, av);
            isum = _mm512_dpbusd_epi32(isum, g, sa);
        }
        acc = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(_mm512_mullo_epi32(isum, ls)), acc);
    }
    _mm512_reduce_add_ps(acc)
}

// Safe entry points. They are only reachable through `Kernels::for_isa(Isa::Avx512)`, which
// checks `is_x86_feature_detected!` for every feature enabled above first.
macro_rules! entry {
    ($pub:ident, $imp:ident) => {
        pub(crate) fn $pub(w: &[u8], a: &[u8]) -> f32 {
            debug_assert!(crate::kernels::Isa::Avx512.available());
            // SAFETY: only handed out after all features of `$imp` were detected at runtime.
            unsafe { $imp(w, a) }
        }
    };
}
entry!(dot_q8_0_q8_0, q8_0_impl);
entry!(dot_q2_k_q8_k, q2_k_impl);
entry!(dot_q4_k_q8_k, q4_k_impl);
entry!(dot_iq2_xxs_q8_k, iq2_xxs_impl);
entry!(dot_iq2_xxs_q8_kt, iq2_xxs_t_impl);
