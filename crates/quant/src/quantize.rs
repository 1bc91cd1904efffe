//! Quantizers. Q8_0 and Q8_K follow ggml's reference rows exactly; Q2_K, Q4_K and IQ2_XXS
//! live in their own modules.

use crate::blocks::*;
use crate::{GgmlType, QuantError};

/// Round to nearest, ties to even, for |x| ≤ 2^22, with float adds only (the 1.5·2^23 trick
/// ggml's `nearest_int` uses): on baseline x86-64 `f32::round_ties_even` is a libm call,
/// which dominated activation quantization. Equal to `blocks::nearest_int` in that range.
#[inline(always)]
fn round_even_small(x: f32) -> f32 {
    const MAGIC: f32 = 12_582_912.0; // 1.5 · 2^23
    (x + MAGIC) - MAGIC
}

/// `f32::round` (ties away from zero) for |x| ≤ 2^22 without a libm call.
#[inline(always)]
fn round_away_small(x: f32) -> f32 {
    let y = x.abs();
    let mut n = round_even_small(y);
    // Exact: y and n are within 0.5 of each other. A tie rounded down to even goes up.
    if y - n == 0.5 {
        n += 1.0;
    }
    n.copysign(x)
}

/// ggml `quantize_row_q8_0_ref`: d = amax/127, q = round-half-away(x/d).
pub fn quantize_row_q8_0(x: &[f32], out: &mut [u8]) {
    for (xb, ob) in x.chunks_exact(QK8_0).zip(out.chunks_exact_mut(Q8_0_BYTES)) {
        let amax = xb.iter().fold(0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        ob[0..2].copy_from_slice(&f16_bits(d));
        for (o, &v) in ob[2..].iter_mut().zip(xb) {
            // |v·id| ≤ 127 (up to rounding), well inside round_away_small's range.
            *o = round_away_small(v * id) as i8 as u8;
        }
    }
}

/// ggml `quantize_row_q8_K_ref`: signed max maps to -127, d stored as f32, plus 16 bsums.
pub fn quantize_row_q8_k(x: &[f32], out: &mut [u8]) {
    for (xb, ob) in x.chunks_exact(QK_K).zip(out.chunks_exact_mut(Q8_K_BYTES)) {
        let mut amax = 0f32;
        let mut max = 0f32;
        for &v in xb {
            if v.abs() > amax {
                amax = v.abs();
                max = v;
            }
        }
        if amax == 0.0 {
            ob.fill(0);
            continue;
        }
        let iscale = -127.0f32 / max;
        for (o, &v) in ob[4..4 + QK_K].iter_mut().zip(xb) {
            // |iscale·v| ≤ 127 (up to rounding), well inside round_even_small's range.
            *o = (round_even_small(iscale * v) as i32).min(127) as i8 as u8;
        }
        for k in 0..16 {
            let s: i32 = ob[4 + 16 * k..4 + 16 * k + 16].iter().map(|&q| q as i8 as i32).sum();
            ob[4 + QK_K + 2 * k..4 + QK_K + 2 * k + 2].copy_from_slice(&(s as i16).to_le_bytes());
        }
        ob[0..4].copy_from_slice(&(1.0f32 / iscale).to_le_bytes());
    }
}

/// Quantize `src` to `ty`.
pub fn quantize(ty: GgmlType, src: &[f32]) -> Result<Vec<u8>, QuantError> {
    let n = src.len();
    let bytes = ty.row_bytes(n).ok_or(QuantError::BadShape { ty: ty.name(), cols: n })?;
    let mut out = vec![0u8; bytes];
    match ty {
        GgmlType::F32 => {
            for (o, v) in out.chunks_exact_mut(4).zip(src) {
                o.copy_from_slice(&v.to_le_bytes());
            }
        }
        GgmlType::F16 => {
            for (o, v) in out.chunks_exact_mut(2).zip(src) {
                o.copy_from_slice(&f16_bits(*v));
            }
        }
        GgmlType::BF16 => {
            // Round to nearest even, like ggml's GGML_FP32_TO_BF16 (NaN kept quiet).
            for (o, v) in out.chunks_exact_mut(2).zip(src) {
                o.copy_from_slice(&half::bf16::from_f32(*v).to_bits().to_le_bytes());
            }
        }
        GgmlType::Q8_0 => quantize_row_q8_0(src, &mut out),
        GgmlType::Q8_K => quantize_row_q8_k(src, &mut out),
        GgmlType::Q2_K => crate::quant_k::quantize_row_q2_k(src, &mut out),
        GgmlType::Q4_K => crate::quant_k::quantize_row_q4_k(src, &mut out),
        GgmlType::IQ2_XXS => crate::quant_iq2xxs::quantize_row_iq2_xxs(src, &mut out, None),
        GgmlType::I32 => return Err(QuantError::Unsupported(ty.name())),
    }
    Ok(out)
}

#[cfg(test)]
mod round_tests {
    use super::*;

    #[test]
    fn small_rounding_matches_std() {
        // Every f32 in [-200, 200] with a fractional step of 2^-10, plus exact ties.
        let mut x = -200.0f32;
        while x <= 200.0 {
            for v in [x, x + 0.5, x - 0.5, x.next_up(), x.next_down()] {
                assert_eq!(round_even_small(v), v.round_ties_even(), "{v}");
                assert_eq!(round_away_small(v).to_bits(), v.round().to_bits(), "{v}");
            }
            x += 1.0 / 1024.0;
        }
    }
}
