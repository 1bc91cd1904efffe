//! Large host <-> device copies through two pinned staging buffers: the host side copies one slice in
//! parallel while the DMA of the other runs. The driver's path for pageable memory copies on one
//! thread through its own small buffers; at a distributed stage's prefill hop (a 4096-token Flash
//! chunk: 256 MiB of hidden rows each way) that path cost tens of milliseconds a direction.
use crate::gpu::{e, Gpu, Result};
use cudarc::driver::{result as drv, sys as dsys};
use rayon::prelude::*;
use std::ffi::c_void;

/// Bytes one rayon task copies between the staging buffer and the caller's memory.
const PIECE: usize = 4 << 20;

pub struct HostStaging {
    /// Two pinned host buffers of `slice` bytes (addresses as integers: the struct is moved between
    /// threads with the stage that owns it).
    bufs: [usize; 2],
    /// Recorded on the stream after each buffer's last DMA.
    evs: [dsys::CUevent; 2],
    /// A DMA from the buffer may still run (wait on its event before reusing it).
    used: [bool; 2],
    /// The buffer the next host-to-device slice goes through.
    next: usize,
    slice: usize,
}

// SAFETY: the buffers and events belong to the owning stage's context, which every use binds to the
// calling thread first; `&mut self` makes each use exclusive.
unsafe impl Send for HostStaging {}

impl HostStaging {
    /// Two pinned buffers of `slice` bytes each (allocated in the current context).
    pub fn new(slice: usize) -> Result<Self> {
        let mut s = Self { bufs: [0; 2], evs: [std::ptr::null_mut(); 2], used: [false; 2], next: 0, slice: slice.max(PIECE) };
        for k in 0..2 {
            // SAFETY: a pinned host allocation, freed in Drop (a partly built value frees what it holds).
            s.bufs[k] = unsafe { drv::malloc_host(s.slice, 0) }.map_err(e("cuMemHostAlloc"))? as usize;
            s.evs[k] = drv::event::create(dsys::CUevent_flags::CU_EVENT_DISABLE_TIMING).map_err(e("cuEventCreate"))?;
        }
        Ok(s)
    }

    /// Buffer `w`'s first `len` bytes.
    #[allow(clippy::mut_from_ref)]
    fn buf(&self, w: usize, len: usize) -> &mut [u8] {
        // SAFETY: bufs[w] holds `slice` >= len bytes for the life of self; callers wait on the buffer's
        // event before touching it, so no DMA reads or writes it meanwhile, and use one view at a time.
        unsafe { std::slice::from_raw_parts_mut(self.bufs[w] as *mut u8, len) }
    }

    /// Waits until no DMA runs from or into buffer `w`.
    fn wait(&mut self, w: usize) -> Result<()> {
        if self.used[w] {
            // SAFETY: the event was recorded on the stream after the buffer's last DMA.
            unsafe { drv::event::synchronize(self.evs[w]) }.map_err(e("cuEventSynchronize"))?;
            self.used[w] = false;
        }
        Ok(())
    }

    /// Queues the copy of `src` to device address `dst` on `g`'s stream (work queued after it sees the
    /// data; `src` may change once this returns). `progress` gets the bytes done after each slice.
    pub fn htod(&mut self, g: &Gpu, dst: u64, src: &[u8], mut progress: impl FnMut(usize)) -> Result<()> {
        for off in (0..src.len()).step_by(self.slice) {
            let len = self.slice.min(src.len() - off);
            let w = self.next;
            self.wait(w)?;
            self.buf(w, len).par_chunks_mut(PIECE).zip(src[off..off + len].par_chunks(PIECE)).for_each(|(d, s)| d.copy_from_slice(s));
            // SAFETY: dst + off has len bytes in the caller's device allocation; the pinned source is not
            // touched again before the event recorded after this copy completes (`wait`).
            unsafe {
                dsys::cuMemcpyHtoDAsync_v2(dst + off as u64, self.bufs[w] as *const c_void, len, g.stream).result().map_err(e("cuMemcpyHtoDAsync"))?;
                drv::event::record(self.evs[w], g.stream).map_err(e("cuEventRecord"))?;
            }
            self.used[w] = true;
            self.next ^= 1;
            progress(off + len);
        }
        Ok(())
    }

    /// Copies `dst.len()` bytes from device address `src` (after the work queued on `g`'s stream) into
    /// `dst`: the DMA of slice k + 1 runs while slice k is copied out.
    pub fn dtoh(&mut self, g: &Gpu, dst: &mut [u8], src: u64) -> Result<()> {
        self.wait(0)?;
        self.wait(1)?;
        let n = dst.len();
        let slices = n.div_ceil(self.slice);
        let slice = self.slice;
        let span = |k: usize| (k * slice, slice.min(n - k * slice));
        for k in 0..slices.min(2) {
            self.fetch(g, src, k, span(k))?;
        }
        for k in 0..slices {
            let (off, len) = span(k);
            self.wait(k & 1)?;
            dst[off..off + len].par_chunks_mut(PIECE).zip(self.buf(k & 1, len).par_chunks(PIECE)).for_each(|(d, s)| d.copy_from_slice(s));
            if k + 2 < slices {
                self.fetch(g, src, k + 2, span(k + 2))?;
            }
        }
        Ok(())
    }

    /// Queues the DMA of device bytes `src + off .. + len` into buffer `k & 1` (free: waited for).
    fn fetch(&mut self, g: &Gpu, src: u64, k: usize, (off, len): (usize, usize)) -> Result<()> {
        let w = k & 1;
        // SAFETY: the pinned buffer holds len bytes and nothing reads it until its event completes;
        // src + off has len bytes in the device allocation.
        unsafe {
            dsys::cuMemcpyDtoHAsync_v2(self.bufs[w] as *mut c_void, src + off as u64, len, g.stream).result().map_err(e("cuMemcpyDtoHAsync"))?;
            drv::event::record(self.evs[w], g.stream).map_err(e("cuEventRecord"))?;
        }
        self.used[w] = true;
        Ok(())
    }
}

impl Drop for HostStaging {
    fn drop(&mut self) {
        for k in 0..2 {
            // A host-to-device copy may still read the buffer.
            let _ = self.wait(k);
            // SAFETY: nothing is in flight (waited above); freeing what `new` allocated (null entries of a
            // partly built value are skipped).
            unsafe {
                if !self.evs[k].is_null() {
                    let _ = drv::event::destroy(self.evs[k]);
                }
                if self.bufs[k] != 0 {
                    let _ = drv::free_host(self.bufs[k] as *mut c_void);
                }
            }
        }
    }
}
