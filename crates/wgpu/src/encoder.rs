//! One step's command recording: compute passes opened on demand, ended before a copy.
use std::sync::Arc;
use std::time::Instant;

use crate::gpu::{Gpu, Seqs, Step};
use crate::profile::Profiler;

pub struct Encoder {
    pub(crate) step: Step,
    pub(crate) seqs: Seqs,
    enc: wgpu::CommandEncoder,
    pass: Option<wgpu::ComputePass<'static>>,
    /// Profiling (`DS4_WGPU_PROFILE`): the op names of the timestamps written so far, and when
    /// recording began.
    profiler: Option<Arc<Profiler>>,
    marks: Vec<&'static str>,
    pub(crate) begun: Instant,
    /// Recording time of a step recorded ahead (`sealed`), for the profile.
    pub(crate) recorded: Option<std::time::Duration>,
}

impl Encoder {
    pub(crate) fn new(gpu: &Gpu, step: Step) -> Self {
        let enc = gpu.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("step") });
        let mut e = Self { step, seqs: Seqs::One { slot: 0 }, enc, pass: None, profiler: gpu.profiler.clone(), marks: Vec::new(), begun: Instant::now(), recorded: None };
        e.mark("start");
        e
    }

    /// A step recorded ahead, complete: notes how long recording took.
    pub(crate) fn sealed(mut self) -> Self {
        self.recorded = Some(self.begun.elapsed());
        self
    }

    /// Under the profiler, a timestamp after the work recorded so far: the GPU time since the
    /// previous mark is counted as `op`'s. Nothing otherwise.
    pub(crate) fn mark(&mut self, op: &'static str) {
        let Some(p) = self.profiler.clone() else { return };
        let Some(i) = Profiler::slot(self.marks.len()) else { return };
        self.pass().write_timestamp(&p.queries, i);
        self.marks.push(op);
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

    /// The recorded commands, and under the profiler the names of the step's timestamps.
    pub(crate) fn finish(self) -> (wgpu::CommandBuffer, Vec<&'static str>) {
        let Self { mut enc, pass, profiler, marks, .. } = self;
        drop(pass);
        if let Some(p) = profiler.filter(|_| marks.len() > 1) {
            p.resolve(&mut enc, marks.len() as u32);
        }
        (enc.finish(), marks)
    }
}
