//! One step's command recording: compute passes opened on demand, ended before a copy.
use crate::gpu::{Gpu, Seqs, Step};

pub struct Encoder {
    pub(crate) step: Step,
    pub(crate) seqs: Seqs,
    enc: wgpu::CommandEncoder,
    pass: Option<wgpu::ComputePass<'static>>,
}

impl Encoder {
    pub(crate) fn new(gpu: &Gpu, step: Step) -> Self {
        let enc = gpu.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("step") });
        Self { step, seqs: Seqs::One { slot: 0 }, enc, pass: None }
    }

    /// The step this recording runs with.
    pub fn step(&self) -> Step {
        self.step
    }

    /// Whether the rows are independent sequences (a batched step).
    pub(crate) fn batched(&self) -> bool {
        self.seqs == Seqs::Batch
    }

    /// One past the last position the step writes (of any of its sequences), None on overflow.
    pub(crate) fn end(&self) -> Option<u32> {
        let st = self.step;
        if self.batched() { st.pos.checked_add(1) } else { st.pos.checked_add(st.ntok) }
    }

    /// The current compute pass (opened if none is).
    pub(crate) fn pass(&mut self) -> &mut wgpu::ComputePass<'static> {
        let enc = &mut self.enc;
        self.pass.get_or_insert_with(|| {
            enc.begin_compute_pass(&wgpu::ComputePassDescriptor { label: Some("ops"), timestamp_writes: None }).forget_lifetime()
        })
    }

    /// Records a buffer copy (ends the open compute pass first).
    pub(crate) fn copy(&mut self, src: &wgpu::Buffer, dst: &wgpu::Buffer, size: u64) {
        self.copy_at(src, 0, dst, 0, size);
    }

    /// Records a copy of `size` bytes between offsets (ends the open compute pass first).
    pub(crate) fn copy_at(&mut self, src: &wgpu::Buffer, src_off: u64, dst: &wgpu::Buffer, dst_off: u64, size: u64) {
        self.pass = None;
        self.enc.copy_buffer_to_buffer(src, src_off, dst, dst_off, size);
    }

    pub(crate) fn finish(self) -> wgpu::CommandBuffer {
        let Self { enc, pass, .. } = self;
        drop(pass);
        enc.finish()
    }
}
