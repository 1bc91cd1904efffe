//! Weights read in place from host memory (`--cuda-weights host`, the default on an integrated GPU):
//! the mapped file's pages are registered with the driver (read-only, portable to every context) and
//! the kernels take device pointers into them, so no device copy exists. One registration per set of
//! page ranges serves every stage of a process (pipeline parts share the stage's mapping).
use crate::gpu::Result;
use crate::host_ranges::{locate, page_ranges};
use cudarc::driver::{result as drv, sys as dsys};
use std::ffi::{c_int, c_void};
use std::sync::{Arc, Mutex, Weak};

/// Where a stage's weights are read from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WeightPlace {
    /// Copied once into device memory (a discrete GPU).
    Device,
    /// Read in place from the registered host mapping (over PCIe on a discrete GPU; the same memory on
    /// an integrated one).
    Host,
}

/// Whether CUDA device `device` shares the host's memory (an integrated GPU such as the GB10).
pub fn integrated(device: usize) -> Result<bool> {
    crate::gpu::preload_libs();
    // SAFETY: probing for libcuda.
    if !unsafe { dsys::is_culib_present() } {
        return Err("no CUDA driver (libcuda) found: --backend cuda needs an NVIDIA GPU and its driver".into());
    }
    drv::init().map_err(|e| format!("no usable CUDA device: {e:?}"))?;
    let dev = drv::device::get(device as c_int).map_err(|e| format!("no usable CUDA device {device}: {e:?}"))?;
    // SAFETY: dev is a valid device handle from cuDeviceGet.
    let v = unsafe { drv::device::get_attribute(dev, dsys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_INTEGRATED) }.map_err(|e| format!("device attribute: {e:?}"))?;
    Ok(v != 0)
}

/// Registered page ranges, unregistered when the last stage using them goes.
pub(crate) struct Pinned {
    ranges: Vec<(usize, usize)>,
}

impl Drop for Pinned {
    fn drop(&mut self) {
        for &(s, _) in &self.ranges {
            // SAFETY: s starts a range this struct registered (once); the owning stage has bound its context.
            unsafe { let _ = dsys::cuMemHostUnregister(s as *mut c_void); }
        }
    }
}

static PINNED: Mutex<Vec<Weak<Pinned>>> = Mutex::new(Vec::new());

/// Registers (or finds registered) the pages holding `spans` (host address, length).
pub(crate) fn pin(spans: &[(usize, usize)]) -> Result<Arc<Pinned>> {
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc_page_size() };
    let ranges = page_ranges(spans, page);
    let mut reg = PINNED.lock().map_err(|_| "host registration table poisoned".to_string())?;
    reg.retain(|w| w.strong_count() > 0);
    if let Some(p) = reg.iter().filter_map(Weak::upgrade).find(|p| p.ranges == ranges) {
        return Ok(p);
    }
    let flags = dsys::CU_MEMHOSTREGISTER_READ_ONLY | dsys::CU_MEMHOSTREGISTER_DEVICEMAP | dsys::CU_MEMHOSTREGISTER_PORTABLE;
    let mut done = Pinned { ranges: Vec::new() };
    for &(s, n) in &ranges {
        // SAFETY: [s, s+n) lies inside live read-only mappings of the weights (whole pages of them); the
        // READ_ONLY flag matches their protection. Dropping `done` on error unregisters what succeeded.
        let r = unsafe { dsys::cuMemHostRegister_v2(s as *mut c_void, n, flags) };
        if r != dsys::CUresult::CUDA_SUCCESS {
            return Err(format!(
                "registering {:.2} GiB of mapped weights with the GPU failed ({r:?}); use --cuda-weights device",
                n as f64 / (1u64 << 30) as f64
            ));
        }
        done.ranges.push((s, n));
    }
    let p = Arc::new(done);
    reg.push(Arc::downgrade(&p));
    Ok(p)
}

impl Pinned {
    /// Device pointers of `spans` (each inside the registration) in the current context.
    pub(crate) fn device_ptrs(&self, spans: &[(usize, usize)]) -> Result<Vec<u64>> {
        let mut bases = Vec::with_capacity(self.ranges.len());
        for &(s, _) in &self.ranges {
            let mut d: dsys::CUdeviceptr = 0;
            // SAFETY: s starts a registered range; d is a valid out-pointer.
            let r = unsafe { dsys::cuMemHostGetDevicePointer_v2(&mut d, s as *mut c_void, 0) };
            if r != dsys::CUresult::CUDA_SUCCESS {
                return Err(format!("device pointer of registered weights: {r:?}"));
            }
            bases.push(d);
        }
        spans
            .iter()
            .map(|&(a, n)| match locate(&self.ranges, a) {
                Some((i, off)) if off + n <= self.ranges[i].1 => Ok(bases[i] + off as u64),
                _ => Err(format!("weights at {a:#x} (+{n}) are outside the registered pages")),
            })
            .collect()
    }

    pub(crate) fn bytes(&self) -> u64 { self.ranges.iter().map(|r| r.1 as u64).sum() }
}

/// The host's page size.
unsafe fn libc_page_size() -> usize {
    extern "C" {
        fn sysconf(name: c_int) -> std::ffi::c_long;
    }
    // _SC_PAGESIZE is 30 on Linux.
    let v = sysconf(30);
    if v > 0 { v as usize } else { 4096 }
}
