//! Block layouts (GGML-compatible) and small helpers shared by all code paths.
//! See dsv4-architecture.md §4.5.

use half::{bf16, f16};

pub const QK8_0: usize = 32;
pub const QK_K: usize = 256;

pub const Q8_0_BYTES: usize = 34;
pub const Q8_K_BYTES: usize = 292;
pub const Q2_K_BYTES: usize = 84;
pub const Q4_K_BYTES: usize = 144;
pub const IQ2_XXS_BYTES: usize = 66;

#[inline(always)]
pub fn f16_at(b: &[u8], off: usize) -> f32 {
    f16::from_bits(u16::from_le_bytes([b[off], b[off + 1]])).to_f32()
}

#[inline(always)]
pub fn bf16_at(b: &[u8], off: usize) -> f32 {
    bf16::from_bits(u16::from_le_bytes([b[off], b[off + 1]])).to_f32()
}

#[inline(always)]
pub fn f32_at(b: &[u8], off: usize) -> f32 {
    f32::from_le_bytes([b[off], b[off + 1], b[off + 2], b[off + 3]])
}

#[inline(always)]
pub fn u16_at(b: &[u8], off: usize) -> u16 {
    u16::from_le_bytes([b[off], b[off + 1]])
}

#[inline(always)]
pub fn u32_at(b: &[u8], off: usize) -> u32 {
    u32::from_le_bytes([b[off], b[off + 1], b[off + 2], b[off + 3]])
}

#[inline(always)]
pub fn f16_bits(x: f32) -> [u8; 2] {
    f16::from_f32(x).to_bits().to_le_bytes()
}

/// Q4_K 6-bit (scale, min) of sub-block `j` (0..8) from the 12 packed scale bytes.
#[inline(always)]
pub fn q4k_scale_min(j: usize, s: &[u8]) -> (u8, u8) {
    if j < 4 {
        (s[j] & 63, s[j + 4] & 63)
    } else {
        ((s[j + 4] & 15) | ((s[j - 4] >> 6) << 4), (s[j + 4] >> 4) | ((s[j] >> 6) << 4))
    }
}

/// Round to nearest, ties to even (ggml's `nearest_int` for |x| < 2^22).
#[inline(always)]
pub fn nearest_int(x: f32) -> i32 {
    x.round_ties_even() as i32
}

/// f16 bits → f32 with plain integer/float ops (exact for every finite f16, including
/// subnormals; inf/NaN take the `half` path). Used by the SIMD kernels for block scales:
/// it has no runtime feature dispatch and no false dependency on a vector register.
#[inline(always)]
pub fn f16_bits_to_f32(h: u16) -> f32 {
    let mag = (h & 0x7fff) as u32;
    if mag >= 0x7c00 {
        return f16::from_bits(h).to_f32();
    }
    // Place exponent+mantissa in f32 position, then rescale the exponent bias by 2^112.
    let v = f32::from_bits(mag << 13) * f32::from_bits(0x7780_0000);
    f32::from_bits(v.to_bits() | (((h & 0x8000) as u32) << 16))
}

#[inline(always)]
pub fn f16_at_fast(b: &[u8], off: usize) -> f32 {
    f16_bits_to_f32(u16::from_le_bytes([b[off], b[off + 1]]))
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn f16_bits_to_f32_matches_half_for_all_values() {
        for h in 0..=u16::MAX {
            let want = f16::from_bits(h).to_f32();
            let got = f16_bits_to_f32(h);
            assert!(got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()), "{h:#x}");
        }
    }
}
