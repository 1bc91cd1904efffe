//! Is the Vulkan loader present? wgpu (through ash) dlopens it and, when it is missing, simply
//! reports no adapter; probing it ourselves lets the error name the real fix.

/// The loader's file name on this platform.
#[cfg(target_os = "windows")]
pub const VULKAN_LOADER: &str = "vulkan-1.dll";
#[cfg(all(not(target_os = "windows"), not(target_vendor = "apple")))]
pub const VULKAN_LOADER: &str = "libvulkan.so.1";
#[cfg(target_vendor = "apple")]
pub const VULKAN_LOADER: &str = "libvulkan.1.dylib";

/// Whether the shared library `name` can be loaded (it is unloaded again at once).
#[cfg(not(target_vendor = "apple"))]
pub fn library_present(name: &str) -> bool {
    // SAFETY: loading the Vulkan loader only runs its initialisers, the same ones wgpu runs when it
    // loads it; nothing is called through the handle. Tested by `loader_probe` in tests/errors.rs.
    unsafe { libloading::Library::new(name) }.is_ok()
}

/// On Apple platforms the Metal backend needs no loader; Vulkan (MoltenVK) is not used.
#[cfg(target_vendor = "apple")]
pub fn library_present(_name: &str) -> bool {
    false
}
