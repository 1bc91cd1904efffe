//! The GPU stage of DwarfStar: the forward pass of a stage written once, over the device-op trait
//! [`DeviceOps`] that every GPU backend (CUDA, wgpu) implements with its kernels.
mod attention;
mod error;
mod ffn;
mod mtp;
mod ops;
mod stage;

pub use error::{GpuError, Result};
pub use mtp::{GpuMtp, MtpDevice, MtpOps, PairHidden};
pub use ops::{Compressor, DeviceOps, Lane, LayerInfo, Step, Sub};
pub use stage::GpuStage;
