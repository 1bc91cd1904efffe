//! Deterministic random *valid* blocks (sane f16 scales, other bytes uniform) for tests and
//! benchmarks. Not cryptographic; a SplitMix64 stream.

use crate::blocks::*;
use crate::GgmlType;

/// SplitMix64 generator.
#[derive(Clone, Debug)]
pub struct SplitMix64(pub u64);

impl SplitMix64 {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in [0, 1).
    pub fn f32(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32
    }
    pub fn range(&mut self, lo: f32, hi: f32) -> f32 {
        lo + (hi - lo) * self.f32()
    }
    /// Approximately standard normal (sum of 4 uniforms, rescaled).
    pub fn normal(&mut self) -> f32 {
        let s: f32 = (0..4).map(|_| self.f32()).sum::<f32>() - 2.0;
        s * 1.732_050_8
    }
    pub fn fill_bytes(&mut self, out: &mut [u8]) {
        for c in out.chunks_mut(8) {
            let v = self.next_u64().to_le_bytes();
            c.copy_from_slice(&v[..c.len()]);
        }
    }
}

/// `nblocks` random valid blocks of `ty` (for F32/F16/BF16: `nblocks` elements ~ N(0,1)).
pub fn random_valid_blocks(ty: GgmlType, seed: u64, nblocks: usize) -> Vec<u8> {
    let mut rng = SplitMix64(seed);
    let bb = ty.block_bytes();
    let mut out = vec![0u8; bb * nblocks];
    match ty {
        GgmlType::F32 => {
            for c in out.chunks_exact_mut(4) {
                c.copy_from_slice(&rng.normal().to_le_bytes());
            }
        }
        GgmlType::F16 => {
            for c in out.chunks_exact_mut(2) {
                c.copy_from_slice(&f16_bits(rng.normal()));
            }
        }
        GgmlType::BF16 => {
            for c in out.chunks_exact_mut(2) {
                c.copy_from_slice(&half::bf16::from_f32(rng.normal()).to_bits().to_le_bytes());
            }
        }
        GgmlType::I32 => rng.fill_bytes(&mut out),
        _ => {
            rng.fill_bytes(&mut out);
            for b in out.chunks_exact_mut(bb) {
                let d = rng.range(0.01, 0.1);
                let dmin = rng.range(0.005, 0.05);
                match ty {
                    GgmlType::Q8_0 | GgmlType::IQ2_XXS => b[0..2].copy_from_slice(&f16_bits(d)),
                    GgmlType::Q2_K => {
                        b[80..82].copy_from_slice(&f16_bits(d));
                        b[82..84].copy_from_slice(&f16_bits(dmin));
                    }
                    GgmlType::Q4_K => {
                        b[0..2].copy_from_slice(&f16_bits(d));
                        b[2..4].copy_from_slice(&f16_bits(dmin));
                    }
                    GgmlType::Q8_K => {
                        b[0..4].copy_from_slice(&d.to_le_bytes());
                        for k in 0..16 {
                            let s: i32 = b[4 + 16 * k..20 + 16 * k].iter().map(|&q| q as i8 as i32).sum();
                            b[4 + QK_K + 2 * k..6 + QK_K + 2 * k].copy_from_slice(&(s as i16).to_le_bytes());
                        }
                    }
                    _ => unreachable!(),
                }
            }
        }
    }
    out
}

/// `n` random valid IQ2_XXS blocks.
pub fn random_valid_iq2xxs_blocks(seed: u64, n: usize) -> Vec<u8> {
    random_valid_blocks(GgmlType::IQ2_XXS, seed, n)
}
