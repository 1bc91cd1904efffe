//! Portable GPU kernels through wgpu (Vulkan everywhere, Metal on Apple): device selection with
//! typed errors, weights resident once (split across bindings at row boundaries), and WGSL kernels
//! checked against the CPU reference kernels of `ds4_quant`. See README.md.
mod buffer;
mod counters;
mod encoder;
mod error;
mod gpu;
#[cfg(not(target_vendor = "apple"))]
mod host_import;
#[cfg(target_vendor = "apple")]
#[path = "host_import_metal.rs"]
mod host_import;
mod loader;
mod profile;
pub mod ops;
mod resident;
pub mod shaders;
mod stage;

pub use buffer::GpuBuffer;
pub use counters::CounterSnapshot;
pub use encoder::Encoder;
pub use error::WgpuError;
pub use gpu::{BackendChoice, Caps, Gpu, GpuOptions, Step, MAX_BATCH_ROWS, OPTIONAL_FEATURES};
pub use loader::{library_present, VULKAN_LOADER};
pub use resident::{HostBytes, ResidentTensor, TensorPart};
pub use stage::{plan, plan_bytes, plan_mtp, plan_slots, BatchFault, PlanBytes, WgpuMtp, WgpuMtpOps, WgpuOps, WgpuStage};
pub use wgpu;
