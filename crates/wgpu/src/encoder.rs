//! One step's command recording: compute passes opened on demand, ended before a copy.
use crate::gpu::{Gpu, Step};

pub struct Encoder {
    pub(crate) step: Step,
    enc: wgpu::CommandEncoder,
    pass: Option<wgpu::ComputePass<'static>>,
}

impl Encoder {
    pub(crate) fn new(gpu: &Gpu, step: Step) -> Self {
        let enc = gpu.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("step") });
        Self { step, enc, pass: None }
    }

    /// The step this recording runs with.
    pub fn step(&self) -> Step {
        self.step
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
