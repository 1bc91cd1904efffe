//! Zero-copy weights on Metal: a page window of a read-only mmap wrapped as an MTLBuffer with
//! `newBufferWithBytesNoCopy` (shared storage) and handed to wgpu through wgpu-hal. Compile-checked
//! for aarch64-apple-darwin; not run here (no Apple machine).
use std::ffi::c_void;
use std::ptr::NonNull;
use std::sync::Arc;

use objc2_metal::{MTLDevice, MTLResourceOptions};
use wgpu::hal::api::Metal;

/// Apple Silicon's page size; newBufferWithBytesNoCopy needs page-aligned pointers and lengths.
const PAGE: u64 = 16384;

/// Every Metal device can wrap host pages.
pub(crate) fn import_alignment(device: &wgpu::Device) -> Option<u64> {
    // SAFETY: only checks that the device is a Metal one.
    unsafe { device.as_hal::<Metal>() }.map(|_| PAGE)
}

/// The memory Metal recommends a process keep resident on the device (its working-set size).
pub(crate) fn device_local_bytes(device: &wgpu::Device) -> Option<u64> {
    // SAFETY: a read-only query on the live device. Compile-checked only.
    unsafe { device.as_hal::<Metal>() }.map(|hal| hal.raw_device().recommendedMaxWorkingSetSize())
}

/// A storage buffer over `len` bytes at `ptr` (page aligned, inside a mapping that `owner` keeps
/// alive and that nobody writes while the device reads it).
pub(crate) fn import(device: &wgpu::Device, label: &str, ptr: *const u8, len: u64, owner: Arc<dyn Send + Sync>) -> Result<wgpu::Buffer, String> {
    let pointer = NonNull::new(ptr as *mut c_void).ok_or("null pointer")?;
    // Metal releases the block (and with it the mapping's owner) when the buffer is deallocated.
    let keep = block2::RcBlock::new(move |_: NonNull<c_void>, _: usize| {
        let _ = &owner;
    });
    // SAFETY: the window is page aligned and inside the live mapping (the caller checks), the block
    // keeps the mapping alive for the buffer's lifetime, and wgpu only reads the buffer (STORAGE,
    // never mapped). Compile-checked only.
    unsafe {
        let hal = device.as_hal::<Metal>().ok_or("not a Metal device")?;
        let raw = hal
            .raw_device()
            .newBufferWithBytesNoCopy_length_options_deallocator(pointer, len as usize, MTLResourceOptions::StorageModeShared, Some(&keep))
            .ok_or("newBufferWithBytesNoCopy returned nil")?;
        drop(hal);
        let hal_buffer = wgpu::hal::metal::Device::buffer_from_raw(raw, len);
        Ok(device.create_buffer_from_hal::<Metal>(
            hal_buffer,
            &wgpu::BufferDescriptor { label: Some(label), size: len, usage: wgpu::BufferUsages::STORAGE, mapped_at_creation: false },
        ))
    }
}
