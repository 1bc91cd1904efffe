//! Activation wire formats (`--dist-activation-bits`), in blocks of up to 64 floats of a row:
//! - 32: little-endian f32 (exact);
//! - 16: IEEE f16 with one power-of-two scale per block (an i8 exponent): the block is multiplied by
//!   2^-e so its largest magnitude lands in [2^14, 2^15). Scaling by a power of two is exact, so the
//!   only rounding is f16's 11-bit significand (relative error <= 2^-11) whatever the magnitude:
//!   no overflow to infinity above 65504, no loss of precision in f16's subnormal range;
//! - 8: FP8 E4M3 (finite-only variant, max 448) with one f32 scale per block (block amax / 448).
//!
//! Per-block scales keep rows and blocks of very different magnitude at their relative precision.
//! (`bench/results/dist/` has the measured error per format and where the logit error comes from.)
use crate::error::{DistError, Result};
use half::f16;
use half::slice::HalfFloatSliceExt;

pub const FP8_MAX: f32 = 448.0;

pub fn check_bits(bits: u8) -> Result<()> {
    match bits {
        32 | 16 | 8 => Ok(()),
        b => Err(DistError::Usage(format!("--dist-activation-bits {b}: expected 32, 16 or 8"))),
    }
}

/// Scale block: the row, split into blocks of at most 64 floats, so an outlier only coarsens its own
/// block (FP8: one f32 scale, 6% size overhead; f16: one exponent byte, 0.8%).
pub const FP8_MAX_BLOCK: usize = 64;
pub fn fp8_block(row: usize) -> usize { row.clamp(1, FP8_MAX_BLOCK) }

/// Encoded size of `n` floats in rows of `row`.
pub fn encoded_len(n: usize, row: usize, bits: u8) -> usize {
    let blocks = n.div_ceil(fp8_block(row));
    match bits {
        32 => n * 4,
        16 => n * 2 + blocks,
        _ => n + blocks * 4,
    }
}

/// Exponent e of the f16 block scale: amax * 2^-e in [2^14, 2^15) (0 for a zero or non-finite block),
/// clamped so that 2^-e and 2^e stay normal f32 numbers.
fn f16_exponent(block: &[f32]) -> i8 {
    let amax = block.iter().fold(0f32, |m, v| if v.is_finite() { m.max(v.abs()) } else { m });
    if amax == 0.0 || !amax.is_finite() {
        return 0;
    }
    // floor(log2(amax)) from the f32 exponent bits (subnormals count as -127; the clamp covers them).
    let e2 = ((amax.to_bits() >> 23) & 0xFF) as i32 - 127;
    (e2 - 14).clamp(-100, 100) as i8
}

/// FP8 E4M3 (bias 7, no infinities, 0x7F/0xFF are NaN) from f32, round to nearest even, saturating.
pub fn fp8_e4m3_from_f32(x: f32) -> u8 {
    let sign = if x.is_sign_negative() { 0x80u8 } else { 0 };
    let a = x.abs();
    if a.is_nan() {
        return 0x7F;
    }
    if a >= FP8_MAX {
        return sign | 0x7E;
    }
    // Smallest normal is 2^-6; subnormals step by 2^-9.
    if a < 2f32.powi(-6) {
        let m = (a * 512.0).round_ties_even() as u8; // 0..=8; 8 is the smallest normal (0x08)
        return sign | m;
    }
    // a is a normal f32 here: keep 3 of its 23 significand bits, rounding the 20 dropped ones to
    // nearest even (a carry out of the significand steps the exponent, as it should), then rebias
    // the exponent from 127 to 7.
    let b = a.to_bits();
    let r = (b + 0x7_FFFF + ((b >> 20) & 1)) >> 20;
    let code = r - ((127 - 7) << 3);
    if code > 0x7E {
        return sign | 0x7E;
    }
    sign | code as u8
}

/// The 256 FP8 E4M3 values (decoding is a table look-up).
fn fp8_table() -> &'static [f32; 256] {
    static T: std::sync::OnceLock<[f32; 256]> = std::sync::OnceLock::new();
    T.get_or_init(|| std::array::from_fn(|b| fp8_e4m3_to_f32(b as u8)))
}

pub fn fp8_e4m3_to_f32(b: u8) -> f32 {
    let sign = if b & 0x80 != 0 { -1.0 } else { 1.0 };
    let e = ((b >> 3) & 0x0F) as i32;
    let m = (b & 0x07) as f32;
    if e == 15 && b & 0x07 == 7 {
        return f32::NAN;
    }
    if e == 0 {
        sign * m * 2f32.powi(-9)
    } else {
        sign * (1.0 + m / 8.0) * 2f32.powi(e - 7)
    }
}

/// Inputs at least this large (floats) are encoded and decoded block-parallel (a prefill chunk:
/// hundreds of MB); smaller ones (a decoded token) on the calling thread.
const PARALLEL_MIN: usize = 1 << 16;

/// Bytes of one encoded block of `m` floats.
fn block_bytes(m: usize, bits: u8) -> usize {
    match bits {
        32 => 4 * m,
        16 => 1 + 2 * m,
        _ => 4 + m,
    }
}

fn encode_block(r: &[f32], bits: u8, out: &mut [u8]) {
    match bits {
        32 => {
            for (o, v) in out.chunks_exact_mut(4).zip(r) {
                o.copy_from_slice(&v.to_le_bytes());
            }
        }
        16 => {
            let e = f16_exponent(r);
            out[0] = e as u8;
            let inv = 2f32.powi(-(e as i32));
            // Scaled, then converted as a slice (the CPU's f16 conversion instructions where it has
            // them: several values per instruction instead of one call per value).
            let m = r.len();
            let mut t = [0f32; FP8_MAX_BLOCK];
            for (t, v) in t.iter_mut().zip(r) {
                *t = v * inv;
            }
            let mut h = [f16::ZERO; FP8_MAX_BLOCK];
            h[..m].convert_from_f32_slice(&t[..m]);
            for (o, x) in out[1..].chunks_exact_mut(2).zip(&h[..m]) {
                o.copy_from_slice(&x.to_le_bytes());
            }
        }
        _ => {
            let amax = r.iter().fold(0f32, |m, v| if v.is_finite() { m.max(v.abs()) } else { m });
            let scale = if amax > 0.0 { amax / FP8_MAX } else { 1.0 };
            out[..4].copy_from_slice(&scale.to_le_bytes());
            let inv = 1.0 / scale;
            for (o, v) in out[4..].iter_mut().zip(r) {
                *o = fp8_e4m3_from_f32(v * inv);
            }
        }
    }
}

fn decode_block(b: &[u8], bits: u8, out: &mut [f32]) -> Result<()> {
    match bits {
        32 => {
            for (o, c) in out.iter_mut().zip(b.chunks_exact(4)) {
                *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            }
        }
        16 => {
            let e = b[0] as i8;
            if !(-100..=100).contains(&e) {
                return Err(DistError::Protocol(format!("f16 block exponent {e} out of range")));
            }
            let s = 2f32.powi(e as i32);
            let m = out.len();
            let mut h = [f16::ZERO; FP8_MAX_BLOCK];
            for (x, c) in h.iter_mut().zip(b[1..].chunks_exact(2)) {
                *x = f16::from_le_bytes([c[0], c[1]]);
            }
            h[..m].convert_to_f32_slice(out);
            for o in out.iter_mut() {
                *o *= s;
            }
        }
        _ => {
            let s = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            let t = fp8_table();
            for (o, &q) in out.iter_mut().zip(&b[4..]) {
                *o = t[q as usize] * s;
            }
        }
    }
    Ok(())
}

/// Encodes `x` (rows of `row` floats) into `out`, resized to the encoded length; every byte is
/// overwritten, so a reused buffer is not zeroed first (no pass over a prefill chunk's bytes).
pub fn encode(x: &[f32], row: usize, bits: u8, out: &mut Vec<u8>) -> Result<()> {
    check_bits(bits)?;
    let blk = fp8_block(row);
    out.resize(encoded_len(x.len(), row, bits), 0);
    let bb = block_bytes(blk, bits);
    if x.len() >= PARALLEL_MIN {
        use rayon::prelude::*;
        out.par_chunks_mut(bb).zip(x.par_chunks(blk)).for_each(|(o, r)| encode_block(r, bits, o));
    } else {
        out.chunks_mut(bb).zip(x.chunks(blk)).for_each(|(o, r)| encode_block(r, bits, o));
    }
    Ok(())
}

/// 32-bit activations used where they lie: the bytes already are the little-endian f32 values, so a
/// 4-byte-aligned slice (the worker's frame buffer places them so) is the stage's input as it is,
/// without a decode pass. None: another format, a big-endian host or an unaligned slice (decode).
pub fn as_f32(b: &[u8], n: usize, bits: u8) -> Option<&[f32]> {
    if bits != 32 || cfg!(target_endian = "big") || b.len() != n * 4 {
        return None;
    }
    bytemuck::try_cast_slice(b).ok()
}

/// Decodes `n` floats; errors when the byte count does not match (a malformed frame).
pub fn decode(b: &[u8], n: usize, row: usize, bits: u8, out: &mut Vec<f32>) -> Result<()> {
    check_bits(bits).map_err(|e| DistError::Protocol(e.to_string()))?;
    let want = encoded_len(n, row, bits);
    if b.len() != want {
        return Err(DistError::Protocol(format!("activation payload has {} bytes, expected {want} for {n} floats at {bits} bits", b.len())));
    }
    let blk = fp8_block(row);
    let bb = block_bytes(blk, bits);
    // Every float is overwritten below: a reused buffer is only resized.
    out.resize(n, 0.0);
    if n >= PARALLEL_MIN {
        use rayon::prelude::*;
        out.par_chunks_mut(blk).zip(b.par_chunks(bb)).try_for_each(|(o, c)| decode_block(c, bits, o))
    } else {
        out.chunks_mut(blk).zip(b.chunks(bb)).try_for_each(|(o, c)| decode_block(c, bits, o))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fp8_table_roundtrips_exactly() {
        for b in 0u8..=255 {
            let v = fp8_e4m3_to_f32(b);
            if v.is_nan() {
                continue;
            }
            let back = fp8_e4m3_from_f32(v);
            // +0 and -0 both encode to themselves.
            assert_eq!(back, b, "byte {b:#04x} value {v}");
        }
        assert_eq!(fp8_e4m3_to_f32(0x7E), 448.0);
        assert_eq!(fp8_e4m3_from_f32(1e9), 0x7E);
        assert_eq!(fp8_e4m3_from_f32(-1e9), 0xFE);
        assert_eq!(fp8_e4m3_to_f32(0x01), 2f32.powi(-9));
    }

    #[test]
    fn fp8_encoding_is_the_nearest_value_by_search() {
        // Brute force over the 254 finite codes: the nearest value, ties to the even code.
        let finite: Vec<(u8, f32)> = (0u8..=255).filter(|&b| b & 0x7F != 0x7F).map(|b| (b, fp8_e4m3_to_f32(b))).collect();
        let nearest = |x: f32| {
            let mut best = finite[0];
            for &(b, v) in &finite {
                let (d, bd) = ((v - x).abs(), (best.1 - x).abs());
                if d < bd || d == bd && (b & 1) == 0 && (best.0 & 1) == 1 {
                    best = (b, v);
                }
            }
            best.1
        };
        let mut seed = 12345u64;
        for i in 0..200_000 {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            // Magnitudes from 2^-12 to 2^9, both signs, plus exact midpoints every 16th sample.
            let mag = f32::from_bits(((115 + (seed >> 59) as u32 % 22) << 23) | ((seed >> 20) as u32 & 0x7F_FFFF));
            let mut x = if seed & 1 == 0 { mag } else { -mag };
            if i % 16 == 0 {
                let a = fp8_e4m3_to_f32(fp8_e4m3_from_f32(x));
                let b = finite.iter().map(|f| f.1).filter(|&v| v > a).fold(f32::INFINITY, f32::min);
                if b.is_finite() {
                    x = (a + b) / 2.0;
                }
            }
            let want = if x.abs() >= FP8_MAX { FP8_MAX.copysign(x) } else { nearest(x) };
            assert_eq!(fp8_e4m3_to_f32(fp8_e4m3_from_f32(x)), want, "{x}");
        }
    }

    #[test]
    fn large_inputs_encode_and_decode_in_parallel_as_in_series() {
        let row = 256;
        let n = 3 * PARALLEL_MIN + 5 * 64 + 17; // a ragged last block
        let x: Vec<f32> = (0..n).map(|i| ((i as f32 * 0.618).sin() * (1.0 + (i % 97) as f32)).powi(3)).collect();
        for bits in [32u8, 16, 8] {
            let mut whole = Vec::new();
            encode(&x, row, bits, &mut whole).unwrap();
            // Pieces of whole blocks below the parallel threshold, encoded one by one.
            let mut pieces = Vec::new();
            for c in x.chunks(PARALLEL_MIN - 64) {
                let mut p = Vec::new();
                encode(c, row, bits, &mut p).unwrap();
                pieces.extend_from_slice(&p);
            }
            assert_eq!(whole, pieces, "{bits}-bit encoding");
            let (mut d, mut dp) = (Vec::new(), Vec::new());
            decode(&whole, n, row, bits, &mut d).unwrap();
            let bb = block_bytes(64, bits) * ((PARALLEL_MIN - 64) / 64);
            for (c, xc) in whole.chunks(bb).zip(x.chunks(PARALLEL_MIN - 64)) {
                let mut p = Vec::new();
                decode(c, xc.len(), row, bits, &mut p).unwrap();
                dp.extend_from_slice(&p);
            }
            assert!(d.iter().zip(&dp).all(|(a, b)| a.to_bits() == b.to_bits()) && d.len() == n, "{bits}-bit decoding");
        }
    }

    #[test]
    fn aligned_32_bit_bytes_are_the_floats() {
        let x: Vec<f32> = (0..100).map(|i| i as f32 * -0.7).collect();
        let mut e = Vec::new();
        encode(&x, 10, 32, &mut e).unwrap();
        // A u32-backed buffer is 4-byte aligned.
        let words: Vec<u32> = e.chunks_exact(4).map(|c| u32::from_ne_bytes([c[0], c[1], c[2], c[3]])).collect();
        let aligned: &[u8] = bytemuck::cast_slice(&words);
        assert_eq!(as_f32(aligned, 100, 32), Some(&x[..]));
        assert_eq!(as_f32(aligned, 99, 32), None, "length must match");
        assert_eq!(as_f32(&aligned[..200], 50, 16), None, "not 32-bit");
        let odd: Vec<u8> = std::iter::once(0).chain(e.iter().copied()).collect();
        let unaligned = &odd[1..];
        assert!(as_f32(unaligned, 100, 32).is_none() || unaligned.as_ptr() as usize % 4 == 0);
    }

    #[test]
    fn fp8_rounds_to_nearest() {
        // Between 1.0 (0x38) and 1.125 (0x39): midpoint ties to even (1.0).
        assert_eq!(fp8_e4m3_from_f32(1.0625), 0x38);
        assert_eq!(fp8_e4m3_from_f32(1.07), 0x39);
        let mut x = 0.001f32;
        while x < 400.0 {
            let q = fp8_e4m3_to_f32(fp8_e4m3_from_f32(x));
            assert!((q - x).abs() <= x * 0.0625 + 1e-3, "{x} -> {q}");
            x *= 1.37;
        }
    }

    #[test]
    fn formats_roundtrip_within_their_precision() {
        let x: Vec<f32> = (0..1000).map(|i| ((i as f32) * 0.37).sin() * (1.0 + (i % 7) as f32 * 30.0)).collect();
        for bits in [32u8, 16, 8] {
            let mut e = Vec::new();
            encode(&x, 100, bits, &mut e).unwrap();
            assert_eq!(e.len(), encoded_len(x.len(), 100, bits));
            let mut d = Vec::new();
            decode(&e, x.len(), 100, bits, &mut d).unwrap();
            // NaN (a broken decode) counts as unbounded: f32::max would skip it.
            let err = x.iter().zip(&d).map(|(a, b)| (a - b).abs()).fold(0f32, |m, v| if v.is_nan() { f32::INFINITY } else { m.max(v) });
            match bits {
                32 => assert_eq!(err, 0.0),
                16 => assert!(err < 0.2, "{err}"),
                _ => assert!(err < 13.0, "{err}"),
            }
            assert!(decode(&e[..e.len() - 1], x.len(), 100, bits, &mut d).is_err());
        }
        assert!(encode(&x, 10, 12, &mut Vec::new()).is_err());
    }

    /// Plain f16 overflows above 65504 and loses relative precision below 6.1e-5; the scaled blocks
    /// keep 2^-11 relative precision from 1e-20 to 1e20.
    #[test]
    fn f16_blocks_keep_relative_precision_at_any_magnitude() {
        for mag in [1e-20f32, 1e-7, 3e-5, 1.0, 7e4, 1e9, 1e20] {
            let x: Vec<f32> = (0..200).map(|i| mag * (0.5 + ((i as f32) * 0.73).sin())).collect();
            let mut e = Vec::new();
            encode(&x, 100, 16, &mut e).unwrap();
            let mut d = Vec::new();
            decode(&e, x.len(), 100, 16, &mut d).unwrap();
            // Values within a block share an exponent: the bound is relative to the block's max.
            for (xb, db) in x.chunks(50).zip(d.chunks(50)) {
                let amax = xb.iter().fold(0f32, |m, v| m.max(v.abs()));
                for (a, b) in xb.iter().zip(db) {
                    assert!((a - b).abs() <= amax * 2f32.powi(-11), "magnitude {mag}: {a} -> {b}");
                }
            }
            let plain = f16::from_f32(x[0]).to_f32();
            if mag > 1e5 {
                assert!(plain.is_infinite(), "the unscaled cast would overflow at {mag}");
            }
        }
        // Zero blocks and non-finite values survive; a hostile exponent byte is refused.
        let x = [0.0f32, 0.0, f32::INFINITY, 1.0];
        let mut e = Vec::new();
        encode(&x, 2, 16, &mut e).unwrap();
        let mut d = Vec::new();
        decode(&e, 4, 2, 16, &mut d).unwrap();
        assert_eq!(&d[..2], &[0.0, 0.0]);
        assert!(d[2].is_infinite());
        e[0] = 120;
        assert!(decode(&e, 4, 2, 16, &mut d).is_err());
    }
}
