//! The accelerator side of the memory budget: the free memory the plan's device part (weights and KV
//! state) must fit, asked before any weight is uploaded.
use crate::engine::Backend;

/// Free bytes of the accelerators in `devices` (a device named twice counts once), or None when
/// unknown: the device check is then left to the backend's own upload.
///
/// Hook for the CUDA backend: answer from the driver (`cuMemGetInfo` on each device, in
/// `cuda_pipeline`) under `#[cfg(feature = "cuda")]`; the CPU has no device part.
pub(crate) fn device_free(backend: Backend, devices: &[usize]) -> Option<u64> {
    let _ = devices;
    match backend {
        Backend::Cpu => None,
        Backend::Cuda => None,
    }
}
