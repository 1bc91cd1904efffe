//! Typed errors. Each message names the fix.
use thiserror::Error;

#[derive(Debug, Error)]
pub enum WgpuError {
    #[error(
        "the Vulkan loader ({lib}) was not found: install it and a Vulkan driver \
         (Debian/Ubuntu: `apt-get install libvulkan1 mesa-vulkan-drivers`, or your GPU vendor's driver), \
         or use --backend cpu"
    )]
    VulkanLoaderMissing { lib: &'static str },

    #[error(
        "no {backends} adapter found{filter}: install a GPU driver with Vulkan support \
         (or `mesa-vulkan-drivers` for the CPU driver lavapipe), check VK_ICD_FILENAMES / VK_DRIVER_FILES \
         if set, or use --backend cpu"
    )]
    NoAdapter { backends: String, filter: String },

    #[error(
        "the adapter '{adapter}' lacks the feature {feature}, which was required: use an adapter that has it \
         (a newer driver or GPU) or run without requiring it (the kernels have fallbacks)"
    )]
    MissingFeature { adapter: String, feature: &'static str },

    #[error("the adapter '{adapter}' refused the device: {reason}. Update the GPU driver or use --backend cpu")]
    RequestDevice { adapter: String, reason: String },

    #[error(
        "{what} needs a binding of {bytes} bytes, over the adapter's limit of {limit} bytes \
         (max_storage_buffer_binding_size): the tensor must be split across bindings at row boundaries, \
         and one row must fit in one binding; use a smaller shape or another adapter"
    )]
    BindingOverLimit { what: String, bytes: u64, limit: u64 },

    #[error(
        "the model needs {need} bytes of GPU memory on '{adapter}' ({detail}), the device has {have}: \
         use a smaller --ctx or --prefill-chunk, split the layers over machines, or use --backend cpu"
    )]
    OutOfMemory { adapter: String, need: u64, have: u64, detail: String },

    #[error("{what}: {reason}")]
    BadShape { what: String, reason: String },

    #[error("GPU {op} failed: {msg}")]
    Device { op: String, msg: String },
}
