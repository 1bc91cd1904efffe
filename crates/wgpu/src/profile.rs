//! A measuring aid (`DS4_WGPU_PROFILE=1`): GPU time per op from timestamps written between the ops
//! of a step, and the host's time recording steps and waiting for them. Off by default: a profiled
//! step maps a readback buffer after every submit.
use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Timestamps one step can hold (a Flash decode step has about 40 ops a layer).
const CAPACITY: u32 = 4096;

/// Whether the environment asks for the profile.
pub(crate) fn wanted() -> bool {
    std::env::var_os("DS4_WGPU_PROFILE").is_some_and(|v| v != "0")
}

/// The features a profiled device needs.
pub(crate) const FEATURES: wgpu::Features = wgpu::Features::TIMESTAMP_QUERY.union(wgpu::Features::TIMESTAMP_QUERY_INSIDE_PASSES);

#[derive(Default)]
struct Totals {
    /// (decode step, op) -> (GPU nanoseconds, count).
    ops: BTreeMap<(bool, &'static str), (f64, u64)>,
    steps: [u64; 2],
    record: [Duration; 2],
    wait: [Duration; 2],
}

pub(crate) struct Profiler {
    pub(crate) queries: wgpu::QuerySet,
    resolve: wgpu::Buffer,
    read: wgpu::Buffer,
    period_ns: f64,
    totals: Mutex<Totals>,
    /// The submitted step whose timestamps are not read yet: (decode, op names).
    pending: Mutex<Option<(bool, Vec<&'static str>)>>,
}

impl Profiler {
    pub(crate) fn new(device: &wgpu::Device, queue: &wgpu::Queue) -> Self {
        let bytes = CAPACITY as u64 * 8;
        let queries = device.create_query_set(&wgpu::QuerySetDescriptor { label: Some("profile"), ty: wgpu::QueryType::Timestamp, count: CAPACITY });
        let buf = |label, usage| device.create_buffer(&wgpu::BufferDescriptor { label: Some(label), size: bytes, usage, mapped_at_creation: false });
        let resolve = buf("profile resolve", wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC);
        let read = buf("profile read", wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST);
        Self { queries, resolve, read, period_ns: queue.get_timestamp_period() as f64, totals: Mutex::default(), pending: Mutex::new(None) }
    }

    /// Index of the next timestamp of a step that has written `n`, None when the step is full.
    pub(crate) fn slot(n: usize) -> Option<u32> {
        u32::try_from(n).ok().filter(|&i| i < CAPACITY)
    }

    /// Records the copy of the step's `names.len()` timestamps into the readback buffer.
    pub(crate) fn resolve(&self, enc: &mut wgpu::CommandEncoder, n: u32) {
        enc.resolve_query_set(&self.queries, 0..n, &self.resolve, 0);
        enc.copy_buffer_to_buffer(&self.resolve, 0, &self.read, 0, n as u64 * 8);
    }

    pub(crate) fn submitted(&self, decode: bool, names: Vec<&'static str>, record: Duration) {
        let mut t = self.totals.lock().unwrap_or_else(|e| e.into_inner());
        t.steps[decode as usize] += 1;
        t.record[decode as usize] += record;
        drop(t);
        *self.pending.lock().unwrap_or_else(|e| e.into_inner()) = Some((decode, names));
    }

    /// After the queue went idle: the wait, and the pending step's op times.
    pub(crate) fn waited(&self, device: &wgpu::Device, since: Instant) {
        let waited = since.elapsed();
        let pending = self.pending.lock().unwrap_or_else(|e| e.into_inner()).take();
        let mut t = self.totals.lock().unwrap_or_else(|e| e.into_inner());
        let Some((decode, names)) = pending else {
            return;
        };
        t.wait[decode as usize] += waited;
        if names.len() < 2 {
            return;
        }
        let size = names.len() as u64 * 8;
        let slice = self.read.slice(..size);
        slice.map_async(wgpu::MapMode::Read, |_| {});
        if device.poll(wgpu::PollType::wait_indefinitely()).is_err() {
            return;
        }
        if let Ok(view) = slice.get_mapped_range() {
            let ts: &[u64] = bytemuck::cast_slice(&view);
            for i in 1..names.len() {
                let e = t.ops.entry((decode, names[i])).or_default();
                e.0 += ts[i].saturating_sub(ts[i - 1]) as f64 * self.period_ns;
                e.1 += 1;
            }
        }
        self.read.unmap();
    }

    /// The table since the last report (then cleared): per op the GPU time per step and its share,
    /// and the host's record and wait time per step, decode and multi-token steps apart.
    pub(crate) fn report(&self) -> Option<String> {
        let mut t = self.totals.lock().unwrap_or_else(|e| e.into_inner());
        let t = std::mem::take(&mut *t);
        if t.steps == [0, 0] {
            return None;
        }
        let mut out = String::new();
        for decode in [false, true] {
            let steps = t.steps[decode as usize];
            if steps == 0 {
                continue;
            }
            let ops: Vec<_> = t.ops.iter().filter(|((d, _), _)| *d == decode).collect();
            let gpu_ns: f64 = ops.iter().map(|(_, (ns, _))| ns).sum();
            let per = |d: Duration| d.as_secs_f64() * 1e6 / steps as f64;
            out += &format!(
                "\n  wgpu profile, {} steps ({steps}): GPU {:.1} us/step, host recording {:.1} us/step, host waiting {:.1} us/step",
                if decode { "one-token" } else { "multi-token" },
                gpu_ns / 1e3 / steps as f64,
                per(t.record[decode as usize]),
                per(t.wait[decode as usize])
            );
            let mut ops = ops;
            ops.sort_by(|a, b| b.1 .0.total_cmp(&a.1 .0));
            for ((_, name), (ns, count)) in ops {
                out += &format!("\n    {name:<16} {:>10.1} us/step {:>5.1} %  ({count} marks)", ns / 1e3 / steps as f64, 100.0 * ns / gpu_ns.max(1.0));
            }
        }
        Some(out)
    }
}
