//! The hidden rows a distributed stage receives or sends (the HC streams of every token of a step).
//! A decode token's 64 KiB take the driver's plain copy; a prefill chunk's rows (256 MiB for 4096
//! Flash tokens) go through pinned staging buffers, made at the first such copy and kept.
use super::CudaOps;
use crate::gpu::Result;
use crate::staging::HostStaging;

/// Copies at least this large go through the staging buffers.
const STAGED_MIN: usize = 4 << 20;
/// Bytes of each of the two staging buffers.
const STAGING_SLICE: usize = 32 << 20;

impl CudaOps {
    pub(super) fn upload_hidden(&mut self, h: &[f32]) -> Result<()> {
        if !self.staged(std::mem::size_of_val(h))? {
            return self.g.htod(self.wk.x.ptr, h);
        }
        let st = self.staging.as_mut().expect("made by staged()");
        st.htod(&self.g, self.wk.x.ptr, bytemuck::cast_slice(h), |_| {})
    }

    pub(super) fn download_hidden(&mut self, dst: &mut [f32]) -> Result<()> {
        if !self.staged(std::mem::size_of_val(dst))? {
            return self.g.dtoh(dst, self.wk.x.ptr);
        }
        let st = self.staging.as_mut().expect("made by staged()");
        st.dtoh(&self.g, bytemuck::cast_slice_mut(dst), self.wk.x.ptr)
    }

    /// Whether a copy of `bytes` goes through the staging buffers (made here the first time).
    fn staged(&mut self, bytes: usize) -> Result<bool> {
        if bytes < STAGED_MIN {
            return Ok(false);
        }
        if self.staging.is_none() {
            self.staging = Some(HostStaging::new(STAGING_SLICE)?);
        }
        Ok(true)
    }
}
