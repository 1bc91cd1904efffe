//! Activation wire formats (`--dist-activation-bits`): 32 = little-endian f32 (exact), 16 = IEEE
//! f16, 8 = FP8 E4M3 (finite-only variant, max 448) with one f32 scale per row block of up to 64 floats (block amax / 448),
//! so rows of very different magnitude keep their relative precision.
use crate::error::{DistError, Result};
use half::f16;

pub const FP8_MAX: f32 = 448.0;

pub fn check_bits(bits: u8) -> Result<()> {
    match bits {
        32 | 16 | 8 => Ok(()),
        b => Err(DistError::Usage(format!("--dist-activation-bits {b}: expected 32, 16 or 8"))),
    }
}

/// FP8 scale block: the row, split into blocks of at most 64 floats (one f32 scale each), so an
/// outlier only coarsens its own block (6% size overhead).
pub const FP8_MAX_BLOCK: usize = 64;
pub fn fp8_block(row: usize) -> usize { row.clamp(1, FP8_MAX_BLOCK) }

/// Encoded size of `n` floats in rows of `row`.
pub fn encoded_len(n: usize, row: usize, bits: u8) -> usize {
    match bits {
        32 => n * 4,
        16 => n * 2,
        _ => n + n.div_ceil(fp8_block(row)) * 4,
    }
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
    let e = a.log2().floor() as i32;
    // Guard against log2 rounding at exact powers of two.
    let e = if 2f32.powi(e) > a { e - 1 } else if 2f32.powi(e + 1) <= a { e + 1 } else { e };
    let mant = (a / 2f32.powi(e - 3)).round_ties_even() as u32; // 8..=16
    let (e, mant) = if mant == 16 { (e + 1, 8) } else { (e, mant) };
    let be = (e + 7) as u32;
    if be > 15 || (be == 15 && mant - 8 == 7) {
        return sign | 0x7E;
    }
    sign | ((be << 3) as u8) | ((mant - 8) as u8)
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

/// Encodes `x` (rows of `row` floats) into `out` (cleared first).
pub fn encode(x: &[f32], row: usize, bits: u8, out: &mut Vec<u8>) -> Result<()> {
    check_bits(bits)?;
    out.clear();
    out.reserve(encoded_len(x.len(), row, bits));
    match bits {
        32 => {
            for v in x {
                out.extend_from_slice(&v.to_le_bytes());
            }
        }
        16 => {
            for v in x {
                out.extend_from_slice(&f16::from_f32(*v).to_le_bytes());
            }
        }
        _ => {
            for r in x.chunks(fp8_block(row)) {
                let amax = r.iter().fold(0f32, |m, v| if v.is_finite() { m.max(v.abs()) } else { m });
                let scale = if amax > 0.0 { amax / FP8_MAX } else { 1.0 };
                out.extend_from_slice(&scale.to_le_bytes());
                let inv = 1.0 / scale;
                out.extend(r.iter().map(|v| fp8_e4m3_from_f32(v * inv)));
            }
        }
    }
    Ok(())
}

/// Decodes `n` floats; errors when the byte count does not match (a malformed frame).
pub fn decode(b: &[u8], n: usize, row: usize, bits: u8, out: &mut Vec<f32>) -> Result<()> {
    check_bits(bits).map_err(|e| DistError::Protocol(e.to_string()))?;
    let want = encoded_len(n, row, bits);
    if b.len() != want {
        return Err(DistError::Protocol(format!("activation payload has {} bytes, expected {want} for {n} floats at {bits} bits", b.len())));
    }
    out.clear();
    out.reserve(n);
    match bits {
        32 => out.extend(b.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))),
        16 => out.extend(b.chunks_exact(2).map(|c| f16::from_le_bytes([c[0], c[1]]).to_f32())),
        _ => {
            let row = fp8_block(row);
            let mut off = 0;
            let mut left = n;
            while left > 0 {
                let m = left.min(row);
                let s = f32::from_le_bytes([b[off], b[off + 1], b[off + 2], b[off + 3]]);
                off += 4;
                out.extend(b[off..off + m].iter().map(|&q| fp8_e4m3_to_f32(q) * s));
                off += m;
                left -= m;
            }
        }
    }
    Ok(())
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
            let err = x.iter().zip(&d).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
            match bits {
                32 => assert_eq!(err, 0.0),
                16 => assert!(err < 0.2, "{err}"),
                _ => assert!(err < 13.0, "{err}"),
            }
            assert!(decode(&e[..e.len() - 1], x.len(), 100, bits, &mut d).is_err());
        }
        assert!(encode(&x, 10, 12, &mut Vec::new()).is_err());
    }
}
