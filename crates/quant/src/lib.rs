//! Quantized tensor formats and CPU kernels.
//! API CONTRACT (the model crate codes against this; keep signatures stable):
//!
//! - `dequantize(ty, bytes, out)`: scalar reference dequantization, bit-exact vs gguf-py.
//! - `quantize(ty, src) -> Vec<u8>`: quantizers (F32, F16, BF16, Q8_0, Q2_K, Q4_K, IQ2_XXS, Q8_K).
//! - `MatRef`: a row-major matrix view over (possibly quantized) bytes: `rows` rows of `cols` elements.
//! - `matvec(w, x, y)`: y = W·x, fast SIMD path, multithreaded over rows (rayon), activation quantized
//!   internally where that is how the fast path works.
//! - `matmul(w, x, n, y)`: batched, x is n×cols, y is n×rows (weights streamed once for all n).
//! - `Precision::Exact` variants compute with f32 activations on dequantized weights (reference path).
pub use ds4_gguf::GgmlType;

mod error;
pub use error::QuantError;

pub mod blocks;
mod dequant;
pub mod iq2xxs_tables;
pub mod kernels;
mod matvec;
mod quantize;
mod quant_k;
mod quant_iq2xxs;
pub mod random;
pub use random::{random_valid_blocks, random_valid_iq2xxs_blocks};

pub use dequant::{
    dequant_block_iq2_xxs, dequant_block_q2_k, dequant_block_q4_k, dequant_block_q8_0, dequant_block_q8_k,
};
pub use kernels::{detect_isa, Isa, Kernels};
pub use quant_iq2xxs::{quantize_iq2_xxs, quantize_row_iq2_xxs};
pub use quant_k::{quantize_row_q2_k, quantize_row_q4_k};
pub use quantize::{quantize_row_q8_0, quantize_row_q8_k};

/// How a mat-vec treats activations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Precision {
    /// Fast path: activations quantized to Q8_0/Q8_K where the weight type's kernel uses that.
    #[default]
    Fast,
    /// Reference path: weights dequantized to f32, dot in f32 with f32 activations.
    Exact,
}

/// Row-major matrix view: `rows` rows, each `cols` elements of type `ty` (GGUF `[cols, rows]`).
#[derive(Debug, Clone, Copy)]
pub struct MatRef<'a> {
    pub ty: GgmlType,
    pub data: &'a [u8],
    pub rows: usize,
    pub cols: usize,
}

impl<'a> MatRef<'a> {
    /// Checks that `data` holds exactly rows × row_bytes(cols).
    pub fn new(ty: GgmlType, data: &'a [u8], rows: usize, cols: usize) -> Result<Self, QuantError> {
        let rb = ty.row_bytes(cols).ok_or(QuantError::BadShape { ty: ty.name(), cols })?;
        if data.len() != rb * rows {
            return Err(QuantError::BadLength { expected: rb * rows, got: data.len() });
        }
        Ok(Self { ty, data, rows, cols })
    }
    pub fn row_bytes(&self) -> usize { self.ty.row_bytes(self.cols).unwrap_or(0) }
    pub fn row(&self, r: usize) -> &'a [u8] {
        let rb = self.row_bytes();
        &self.data[r * rb..(r + 1) * rb]
    }
    /// Rows [r0, r1) as a sub-matrix (e.g. one expert of a 3-D expert tensor).
    pub fn rows_slice(&self, r0: usize, r1: usize) -> MatRef<'a> {
        let rb = self.row_bytes();
        MatRef { ty: self.ty, data: &self.data[r0 * rb..r1 * rb], rows: r1 - r0, cols: self.cols }
    }
}

/// Scalar reference dequantization of `out.len()` elements (bit-exact vs gguf-py).
/// I32 is converted to f32 numerically.
pub fn dequantize(ty: GgmlType, bytes: &[u8], out: &mut [f32]) -> Result<(), QuantError> {
    dequant::dequantize(ty, bytes, out)
}

/// Quantize `src` (length multiple of the block size) to `ty`.
pub fn quantize(ty: GgmlType, src: &[f32]) -> Result<Vec<u8>, QuantError> {
    quantize::quantize(ty, src)
}

/// y = W·x (y.len() == rows, x.len() == cols). Multithreaded over rows (rayon's current pool).
pub fn matvec(w: &MatRef, x: &[f32], y: &mut [f32], p: Precision) {
    matvec::matvec(w, x, y, p)
}

/// Batched: x is n×cols (row-major, token-major), y is n×rows.
pub fn matmul(w: &MatRef, x: &[f32], n: usize, y: &mut [f32], p: Precision) {
    matvec::matmul(w, x, n, y, p)
}
