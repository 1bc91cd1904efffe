//! Scalar reference dequantization. The arithmetic order mirrors gguf-py's numpy code
//! (`gguf.quants`), which makes the f32 results bit-identical to it.

use crate::blocks::*;
use crate::iq2xxs_tables::{IQ2XXS_GRID, KSIGNS_IQ2XS};
use crate::{GgmlType, QuantError};

/// Dequantize one Q8_0 block (34 bytes) into 32 floats.
#[inline]
pub fn dequant_block_q8_0(b: &[u8], out: &mut [f32]) {
    let d = f16_at(b, 0);
    for (o, &q) in out[..QK8_0].iter_mut().zip(&b[2..34]) {
        *o = d * (q as i8) as f32;
    }
}

/// Dequantize one Q8_K block (292 bytes) into 256 floats.
#[inline]
pub fn dequant_block_q8_k(b: &[u8], out: &mut [f32]) {
    let d = f32_at(b, 0);
    for (o, &q) in out[..QK_K].iter_mut().zip(&b[4..4 + QK_K]) {
        *o = d * (q as i8) as f32;
    }
}

/// Dequantize one Q2_K block (84 bytes) into 256 floats.
#[inline]
pub fn dequant_block_q2_k(b: &[u8], out: &mut [f32]) {
    let scales = &b[0..16];
    let qs = &b[16..80];
    let d = f16_at(b, 80);
    let dmin = f16_at(b, 82);
    for h in 0..2 {
        let q = &qs[32 * h..32 * h + 32];
        for j in 0..4 {
            for l in 0..32 {
                let sc = scales[8 * h + 2 * j + (l >= 16) as usize];
                let dl = d * (sc & 15) as f32;
                let ml = dmin * (sc >> 4) as f32;
                let v = ((q[l] >> (2 * j)) & 3) as f32;
                out[128 * h + 32 * j + l] = dl * v - ml;
            }
        }
    }
}

/// Dequantize one Q4_K block (144 bytes) into 256 floats.
#[inline]
pub fn dequant_block_q4_k(b: &[u8], out: &mut [f32]) {
    let d = f16_at(b, 0);
    let dmin = f16_at(b, 2);
    let scales = &b[4..16];
    let qs = &b[16..144];
    for j in 0..4 {
        let (s0, m0) = q4k_scale_min(2 * j, scales);
        let (s1, m1) = q4k_scale_min(2 * j + 1, scales);
        let (d0, dm0) = (d * s0 as f32, dmin * m0 as f32);
        let (d1, dm1) = (d * s1 as f32, dmin * m1 as f32);
        let q = &qs[32 * j..32 * j + 32];
        for l in 0..32 {
            out[64 * j + l] = d0 * (q[l] & 15) as f32 - dm0;
            out[64 * j + 32 + l] = d1 * (q[l] >> 4) as f32 - dm1;
        }
    }
}

/// Dequantize one IQ2_XXS block (66 bytes) into 256 floats.
#[inline]
pub fn dequant_block_iq2_xxs(b: &[u8], out: &mut [f32]) {
    let d = f16_at(b, 0);
    for g in 0..8 {
        let a0 = u32_at(b, 2 + 8 * g);
        let a1 = u32_at(b, 2 + 8 * g + 4);
        let db = d * (0.5f32 + (a1 >> 28) as f32) * 0.25f32;
        for l in 0..4 {
            let grid = IQ2XXS_GRID[((a0 >> (8 * l)) & 255) as usize].to_le_bytes();
            let signs = KSIGNS_IQ2XS[((a1 >> (7 * l)) & 127) as usize];
            for j in 0..8 {
                let v = db * grid[j] as f32;
                out[32 * g + 8 * l + j] = if signs & (1 << j) != 0 { -v } else { v };
            }
        }
    }
}

/// Scalar reference dequantization of `out.len()` elements of type `ty` from `bytes`.
pub fn dequantize(ty: GgmlType, bytes: &[u8], out: &mut [f32]) -> Result<(), QuantError> {
    let n = out.len();
    let need = ty.row_bytes(n).ok_or(QuantError::BadShape { ty: ty.name(), cols: n })?;
    if bytes.len() < need {
        return Err(QuantError::BadLength { expected: need, got: bytes.len() });
    }
    let bytes = &bytes[..need];
    match ty {
        GgmlType::F32 => {
            for (o, c) in out.iter_mut().zip(bytes.chunks_exact(4)) {
                *o = f32_at(c, 0);
            }
        }
        GgmlType::I32 => {
            // Passthrough as numbers (the integer value converted to f32).
            for (o, c) in out.iter_mut().zip(bytes.chunks_exact(4)) {
                *o = i32::from_le_bytes([c[0], c[1], c[2], c[3]]) as f32;
            }
        }
        GgmlType::F16 => {
            for (o, c) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                *o = f16_at(c, 0);
            }
        }
        GgmlType::BF16 => {
            for (o, c) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                *o = bf16_at(c, 0);
            }
        }
        _ => {
            let f: fn(&[u8], &mut [f32]) = match ty {
                GgmlType::Q8_0 => dequant_block_q8_0,
                GgmlType::Q8_K => dequant_block_q8_k,
                GgmlType::Q2_K => dequant_block_q2_k,
                GgmlType::Q4_K => dequant_block_q4_k,
                GgmlType::IQ2_XXS => dequant_block_iq2_xxs,
                _ => return Err(QuantError::Unsupported(ty.name())),
            };
            let (be, bb) = (ty.block_elems(), ty.block_bytes());
            for (o, b) in out.chunks_exact_mut(be).zip(bytes.chunks_exact(bb)) {
                f(b, o);
            }
        }
    }
    Ok(())
}
