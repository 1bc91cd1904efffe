//! The product of a resident matrix with the step's token rows: the one-token mat-vec when the step
//! has one token, the batched product otherwise (both bound at load).
use super::matvec::{MatVec, Product};
use crate::buffer::GpuBuffer;
use crate::encoder::Encoder;
use crate::error::WgpuError;
use crate::gpu::Gpu;
use crate::resident::ResidentTensor;

pub struct StepMatVec {
    one: MatVec,
    many: Option<MatVec>,
}

impl StepMatVec {
    /// y (max_tokens rows of `w.rows`) = x (max_tokens rows of `w.cols`) . W^T.
    pub fn new(gpu: &Gpu, w: &ResidentTensor, x: &GpuBuffer, y: &GpuBuffer, max_tokens: u32) -> Result<Self, WgpuError> {
        let one = MatVec::new(gpu, w, x, y, Product::Vec)?;
        let many = if max_tokens > 1 { Some(MatVec::new(gpu, w, x, y, Product::Batched { max_tokens })?) } else { None };
        Ok(Self { one, many })
    }

    /// The grouped product (`MatVec::grouped`) for one token or the step's tokens.
    pub fn grouped(gpu: &Gpu, w: &ResidentTensor, x: &GpuBuffer, y: &GpuBuffer, max_tokens: u32, group_rows: usize, x_stride: usize) -> Result<Self, WgpuError> {
        let one = MatVec::grouped(gpu, w, x, y, Product::Vec, group_rows, x_stride)?;
        let many = if max_tokens > 1 { Some(MatVec::grouped(gpu, w, x, y, Product::Batched { max_tokens }, group_rows, x_stride)?) } else { None };
        Ok(Self { one, many })
    }

    pub fn encode(&self, enc: &mut Encoder) -> Result<(), WgpuError> {
        match &self.many {
            Some(m) if enc.step().ntok > 1 => m.encode(enc),
            _ if enc.step().ntok > 1 => Err(WgpuError::BadShape { what: "product".into(), reason: format!("{} tokens, built for one", enc.step().ntok) }),
            _ => self.one.encode(enc),
        }
    }
}
