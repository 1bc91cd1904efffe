//! Zero-copy weights on Vulkan: a window of a read-only mmap imported as device memory through
//! VK_EXT_external_memory_host (wgpu has no portable host import; this goes through wgpu-hal and
//! ash). Pays on unified memory (integrated GPUs, lavapipe); on a discrete GPU the device would
//! read host memory over PCIe, so callers upload there instead.
use std::ffi::{c_void, CStr};
use std::sync::Arc;

use ash::vk;
use wgpu::hal::api::Vulkan;

const EXT: &CStr = ash::ext::external_memory_host::NAME;
const HANDLE: vk::ExternalMemoryHandleTypeFlags = vk::ExternalMemoryHandleTypeFlags::HOST_ALLOCATION_EXT;

/// Opens `adapter` through wgpu-hal with the host-import extension added. None when the adapter is
/// not Vulkan or lacks the extension (the caller then opens it the ordinary way).
pub(crate) fn open_with_import(
    adapter: &wgpu::Adapter,
    desc: &wgpu::DeviceDescriptor,
) -> Option<Result<(wgpu::Device, wgpu::Queue), String>> {
    // SAFETY: the hal adapter is only borrowed for the open call; the extension is supported (checked)
    // and only added, as `open_with_callback` allows; the hal device is handed straight to wgpu.
    // Tested by tests/host_import.rs.
    unsafe {
        let hal = adapter.as_hal::<Vulkan>()?;
        if !hal.physical_device_capabilities().supports_extension(EXT) {
            return None;
        }
        let add_ext: Box<wgpu::hal::vulkan::CreateDeviceCallback> = Box::new(|args| args.extensions.push(EXT));
        let open = hal.open_with_callback(desc.required_features, &desc.required_limits, &desc.memory_hints, Some(add_ext));
        drop(hal);
        Some(match open {
            Ok(open) => adapter.create_device_from_hal(open, desc).map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        })
    }
}

/// Imported memory; freed when the last buffer over it is destroyed by wgpu. Holds the mapping so
/// the host pages outlive the device memory that aliases them.
struct HostMemory {
    device: ash::Device,
    memory: vk::DeviceMemory,
    _owner: Arc<dyn Send + Sync>,
}

impl Drop for HostMemory {
    fn drop(&mut self) {
        // SAFETY: every buffer bound to this memory has been destroyed (each holds an Arc of this).
        unsafe { self.device.free_memory(self.memory, None) };
    }
}

/// The alignment of imported host pointers and sizes (minImportedHostPointerAlignment).
pub(crate) fn import_alignment(device: &wgpu::Device) -> Option<u64> {
    // SAFETY: read-only queries on live handles owned by the device.
    unsafe {
        let hal = device.as_hal::<Vulkan>()?;
        if !hal.enabled_device_extensions().contains(&EXT) {
            return None;
        }
        let mut host = vk::PhysicalDeviceExternalMemoryHostPropertiesEXT::default();
        let mut p2 = vk::PhysicalDeviceProperties2::default().push_next(&mut host);
        hal.shared_instance().raw_instance().get_physical_device_properties2(hal.raw_physical_device(), &mut p2);
        Some(host.min_imported_host_pointer_alignment.max(1))
    }
}

/// The largest device-local memory heap of a Vulkan device (for unified memory: the host's share
/// the driver reports).
pub(crate) fn device_local_bytes(device: &wgpu::Device) -> Option<u64> {
    // SAFETY: read-only query on live handles owned by the device.
    unsafe {
        let hal = device.as_hal::<Vulkan>()?;
        let props = hal.shared_instance().raw_instance().get_physical_device_memory_properties(hal.raw_physical_device());
        let heaps = &props.memory_heaps[..props.memory_heap_count as usize];
        heaps.iter().filter(|h| h.flags.contains(vk::MemoryHeapFlags::DEVICE_LOCAL)).map(|h| h.size).max()
    }
}

/// A storage buffer over `len` bytes at `ptr` (aligned to `import_alignment`, inside a mapping that
/// `owner` keeps alive and that nobody writes while the device reads it).
pub(crate) fn import(device: &wgpu::Device, label: &str, ptr: *const u8, len: u64, owner: Arc<dyn Send + Sync>) -> Result<wgpu::Buffer, String> {
    // SAFETY: the pointer and length are aligned and inside the live mapping (the caller checks);
    // the buffer and memory are created, bound and handed to wgpu, which destroys the buffer through
    // the drop callback once the GPU is done with it; the memory goes with the last buffer.
    // Tested by tests/host_import.rs.
    unsafe {
        let hal = device.as_hal::<Vulkan>().ok_or("not a Vulkan device")?;
        let raw = hal.raw_device().clone();
        let ext = ash::ext::external_memory_host::Device::new(hal.shared_instance().raw_instance(), &raw);
        drop(hal);
        let mut host_props = vk::MemoryHostPointerPropertiesEXT::default();
        (ext.fp().get_memory_host_pointer_properties_ext)(ext.device(), HANDLE, ptr as *const c_void, &mut host_props)
            .result()
            .map_err(|e| format!("vkGetMemoryHostPointerPropertiesEXT: {e}"))?;
        let mut ext_info = vk::ExternalMemoryBufferCreateInfo::default().handle_types(HANDLE);
        let info = vk::BufferCreateInfo::default()
            .size(len)
            .usage(vk::BufferUsageFlags::STORAGE_BUFFER)
            .sharing_mode(vk::SharingMode::EXCLUSIVE)
            .push_next(&mut ext_info);
        let buffer = raw.create_buffer(&info, None).map_err(|e| format!("vkCreateBuffer: {e}"))?;
        let req = raw.get_buffer_memory_requirements(buffer);
        let bits = host_props.memory_type_bits & req.memory_type_bits;
        if bits == 0 || req.size > len {
            raw.destroy_buffer(buffer, None);
            return Err(format!("no memory type for an imported buffer (host bits {:#x}, buffer bits {:#x})", host_props.memory_type_bits, req.memory_type_bits));
        }
        let mut import = vk::ImportMemoryHostPointerInfoEXT::default().handle_type(HANDLE).host_pointer(ptr as *mut c_void);
        let alloc = vk::MemoryAllocateInfo::default().allocation_size(len).memory_type_index(bits.trailing_zeros()).push_next(&mut import);
        let memory = match raw.allocate_memory(&alloc, None) {
            Ok(m) => m,
            Err(e) => {
                raw.destroy_buffer(buffer, None);
                return Err(format!("vkAllocateMemory (import): {e}"));
            }
        };
        let mem = Arc::new(HostMemory { device: raw.clone(), memory, _owner: owner });
        if let Err(e) = raw.bind_buffer_memory(buffer, memory, 0) {
            raw.destroy_buffer(buffer, None);
            return Err(format!("vkBindBufferMemory: {e}"));
        }
        let dev = raw.clone();
        let hal_buffer = wgpu::hal::vulkan::Buffer::from_raw_externally_owned(
            buffer,
            Box::new(move || {
                dev.destroy_buffer(buffer, None);
                drop(mem);
            }),
        );
        Ok(device.create_buffer_from_hal::<Vulkan>(
            hal_buffer,
            &wgpu::BufferDescriptor { label: Some(label), size: len, usage: wgpu::BufferUsages::STORAGE, mapped_at_creation: false },
        ))
    }
}
