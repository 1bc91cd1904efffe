//! The device: adapter choice (Vulkan or Metal, best first), limits and optional features,
//! validation errors turned into `WgpuError` (wgpu panics on uncaptured errors by default).
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::counters::{CounterSnapshot, Counters};
use crate::encoder::Encoder;
use crate::error::WgpuError;
use crate::loader::{library_present, VULKAN_LOADER};

/// Which GPU API to use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum BackendChoice {
    /// Metal on Apple platforms, Vulkan elsewhere.
    #[default]
    Auto,
    Vulkan,
    Metal,
}

/// How to open the device.
#[derive(Debug, Clone, Default)]
pub struct GpuOptions {
    pub backend: BackendChoice,
    /// Only adapters whose name contains this (case-insensitive), e.g. "llvmpipe".
    pub adapter_name: Option<String>,
    /// Caps the binding size of resident weights below the adapter's limit (tests force tensor
    /// splitting with it; activation buffers keep the adapter's limit).
    pub max_binding_bytes: Option<u64>,
    /// Optional features to leave off even when the adapter has them (tests run the fallbacks).
    pub disable: wgpu::Features,
    /// Features the caller cannot do without: an adapter lacking one is an error.
    pub require: wgpu::Features,
    /// Time every op of a step on the GPU (timestamps) and the host's recording and waiting, for
    /// [`Gpu::profile_report`]; also on with `DS4_WGPU_PROFILE=1`. Ignored where the adapter has no
    /// timestamps inside passes.
    pub profile: bool,
    /// Do not open the device with host-memory import (zero-copy weights) even where it is available.
    pub no_host_import: bool,
    /// Compile kernels with naga's runtime checks (index clamps, and bounds checks where the driver has
    /// no robust buffer access; a counter bounding every loop). Off by default: the kernels are this
    /// crate's own, every op checks its buffers against the shapes its kernels index with, and the
    /// checks cost measured speed (`bench/results/wgpu/README.md`). A debugging aid.
    pub runtime_checks: bool,
    /// KV slots of a stage built on this device: sessions resident at once, decoded together in
    /// batched steps (0 or 1: one; at most `MAX_BATCH_ROWS`). Counted by the stage's memory plan.
    pub kv_slots: usize,
    /// Device bytes another stage will take on this device beside the one built with these options
    /// (the MTP drafter): the stage's fit check counts them, so the pair is refused before anything
    /// is uploaded. 0: none.
    pub reserve_bytes: u64,
    /// Test hook: the loader file probed when no adapter is found (default: `VULKAN_LOADER`).
    #[doc(hidden)]
    pub loader_probe: Option<String>,
}

/// What the opened device can do.
#[derive(Debug, Clone)]
pub struct Caps {
    pub adapter: String,
    pub backend: wgpu::Backend,
    pub device_type: wgpu::DeviceType,
    pub driver: String,
    /// `SHADER_F16` enabled.
    pub f16: bool,
    /// `SUBGROUP` enabled (subgroup reductions are used).
    pub subgroup: bool,
    /// `IMMEDIATES` (push constants) enabled.
    pub immediates: bool,
    /// Side of the square cooperative matrices (8 or 16) with f16 inputs and an f32 accumulator, where
    /// the adapter has them and `SHADER_F16` and `SUBGROUP` are on (tensor cores on NVIDIA, simdgroup
    /// matrices on Apple). The prefill tiles use them where subgroups are exactly 32 wide
    /// (`ops::matvec::coop_tile_side`; not Metal, where wgpu reports 4 to 64); `GpuOptions::disable`
    /// with `EXPERIMENTAL_COOPERATIVE_MATRIX` keeps the f32 tiles.
    pub coop: Option<u32>,
    /// `unpack2x16float` usable (wgpu's SHADER_F16_IN_F32 downlevel flag; treated as absent when
    /// SHADER_F16 is disabled through `GpuOptions::disable`, which selects every fallback).
    pub f16_in_f32: bool,
    pub subgroup_min_size: u32,
    pub subgroup_max_size: u32,
    /// Largest storage binding in bytes (the adapter's limit).
    pub max_binding: u64,
    /// Largest binding of one resident-weight part (`max_binding`, or `GpuOptions::max_binding_bytes` if lower).
    pub weight_binding: u64,
    /// Largest buffer in bytes.
    pub max_buffer: u64,
    /// Alignment of host pointers the device can wrap as buffers (Vulkan VK_EXT_external_memory_host,
    /// Metal newBufferWithBytesNoCopy); None where weights can only be uploaded.
    pub host_import_alignment: Option<u64>,
}

/// The optional features the kernels use when present.
pub const OPTIONAL_FEATURES: wgpu::Features =
    wgpu::Features::SHADER_F16.union(wgpu::Features::SUBGROUP).union(wgpu::Features::IMMEDIATES);

/// The square cooperative-matrix side (f16 A and B, f32 C) the kernels use: 16 where the adapter has
/// it (NVIDIA), else 8 (Apple); None without the feature, f16 or subgroups.
fn coop_side(adapter: &wgpu::Adapter, features: wgpu::Features, have: wgpu::Features) -> Option<u32> {
    let needs = wgpu::Features::SHADER_F16 | wgpu::Features::SUBGROUP;
    if !have.contains(wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX) || !features.contains(needs) {
        return None;
    }
    let props = adapter.cooperative_matrix_properties();
    [16u32, 8].into_iter().find(|&n| {
        props.iter().any(|p| {
            p.m_size == n && p.n_size == n && p.k_size == n && p.ab_type == wgpu::CooperativeScalarType::F16 && p.cr_type == wgpu::CooperativeScalarType::F32
        })
    })
}

/// Rows a batched step can have: the step uniform holds each row's KV slot and position (seq.wgsl
/// declares the same 64).
pub const MAX_BATCH_ROWS: usize = 64;

/// Bytes of the step uniform: (ntok, pos, batch, slot), then (slot, pos, 0, 0) per batched row.
const STEP_BYTES: usize = 16 + 16 * MAX_BATCH_ROWS;

/// Per-step values every kernel may read (one uniform, written once per step).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Step {
    /// Tokens (activation rows) in this step.
    pub ntok: u32,
    /// Position of the first token.
    pub pos: u32,
}

/// How a step's rows map to sequences (seq.wgsl).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Seqs {
    /// One sequence, the session in this KV slot, at positions `pos ..`.
    One { slot: u32 },
    /// One sequence per row, each in its own slot at its own position (`pos` is the largest).
    Batch,
}

/// An opened GPU device with its queue, capabilities and pipeline cache.
pub struct Gpu {
    pub(crate) device: wgpu::Device,
    pub(crate) queue: wgpu::Queue,
    caps: Caps,
    pub(crate) counters: Arc<Counters>,
    uncaptured: Arc<Mutex<Vec<String>>>,
    pub(crate) step: wgpu::Buffer,
    pipelines: Mutex<HashMap<String, Arc<wgpu::ComputePipeline>>>,
    iq2_grid: Mutex<Option<Arc<wgpu::Buffer>>>,
    runtime_checks: bool,
    /// Per-op GPU timestamps and host times (`DS4_WGPU_PROFILE=1`, where the adapter has timestamps).
    pub(crate) profiler: Option<Arc<crate::profile::Profiler>>,
    /// Bytes written through mapped-at-creation buffers since the last flush: on a discrete GPU each
    /// is a host staging copy that lives until a submission completes (see `STAGING_FLUSH`).
    staged: std::sync::atomic::AtomicU64,
}

/// Staging bytes after which weight uploads are flushed (an empty submit and a wait): without it a
/// whole model's staging copies pile up in host memory before the first step (the file's pages plus
/// a second copy of the weights).
const STAGING_FLUSH: u64 = 1 << 30;

fn backends_for(choice: BackendChoice) -> wgpu::Backends {
    match choice {
        BackendChoice::Auto => wgpu::Backends::VULKAN | wgpu::Backends::METAL,
        BackendChoice::Vulkan => wgpu::Backends::VULKAN,
        BackendChoice::Metal => wgpu::Backends::METAL,
    }
}

/// Higher is better: discrete, integrated, virtual, CPU (lavapipe), other.
fn rank(info: &wgpu::AdapterInfo) -> u8 {
    match info.device_type {
        wgpu::DeviceType::DiscreteGpu => 4,
        wgpu::DeviceType::IntegratedGpu => 3,
        wgpu::DeviceType::VirtualGpu => 2,
        wgpu::DeviceType::Cpu => 1,
        wgpu::DeviceType::Other => 0,
    }
}

fn feature_name(f: wgpu::Features) -> &'static str {
    const NAMES: [(wgpu::Features, &str); 3] = [
        (wgpu::Features::SHADER_F16, "SHADER_F16"),
        (wgpu::Features::SUBGROUP, "SUBGROUP"),
        (wgpu::Features::IMMEDIATES, "IMMEDIATES"),
    ];
    NAMES.iter().find(|(k, _)| f.contains(*k)).map(|(_, n)| *n).unwrap_or("(a feature outside SHADER_F16/SUBGROUP/IMMEDIATES)")
}

impl Gpu {
    /// Opens the best adapter of the chosen backend with its full limits and the optional features it has.
    pub fn new(opts: &GpuOptions) -> Result<Self, WgpuError> {
        let backends = backends_for(opts.backend);
        let mut desc = wgpu::InstanceDescriptor::new_without_display_handle();
        desc.backends = backends;
        let instance = wgpu::Instance::new(desc);
        let mut adapters = pollster::block_on(instance.enumerate_adapters(backends));
        if let Some(name) = &opts.adapter_name {
            let want = name.to_lowercase();
            adapters.retain(|a| a.get_info().name.to_lowercase().contains(&want));
        }
        let best = adapters.into_iter().max_by_key(|a| (rank(&a.get_info()), a.limits().max_buffer_size));
        let Some(adapter) = best else {
            let loader = opts.loader_probe.as_deref().unwrap_or(VULKAN_LOADER);
            if backends.contains(wgpu::Backends::VULKAN) && !cfg!(target_vendor = "apple") && !library_present(loader) {
                return Err(WgpuError::VulkanLoaderMissing { lib: VULKAN_LOADER });
            }
            let names: Vec<&str> = backends.iter().map(|b| if b == wgpu::Backends::METAL { "Metal" } else { "Vulkan" }).collect();
            let filter = opts.adapter_name.as_ref().map(|n| format!(" whose name contains '{n}'")).unwrap_or_default();
            return Err(WgpuError::NoAdapter { backends: names.join(" or "), filter });
        };
        Self::open(adapter, opts)
    }

    fn open(adapter: wgpu::Adapter, opts: &GpuOptions) -> Result<Self, WgpuError> {
        let info = adapter.get_info();
        let have = adapter.features() - opts.disable;
        let missing = opts.require - have;
        if !missing.is_empty() {
            return Err(WgpuError::MissingFeature { adapter: info.name.clone(), feature: feature_name(missing) });
        }
        let mut features = (have & OPTIONAL_FEATURES) | (opts.require & have);
        let coop = coop_side(&adapter, features, have);
        if coop.is_some() {
            features |= wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX;
        }
        let profile = (opts.profile || crate::profile::wanted()) && have.contains(crate::profile::FEATURES);
        if profile {
            features |= crate::profile::FEATURES;
        }
        let limits = adapter.limits();
        let desc = wgpu::DeviceDescriptor {
            label: Some("ds4-wgpu"),
            required_features: features,
            required_limits: limits.clone(),
            // SAFETY: the only experimental feature requested is cooperative matrices, used by the
            // prefill products alone, each checked against the f32 tiles on the device (ops tests).
            experimental_features: if coop.is_some() { unsafe { wgpu::ExperimentalFeatures::enabled() } } else { wgpu::ExperimentalFeatures::disabled() },
            memory_hints: wgpu::MemoryHints::Performance,
            trace: wgpu::Trace::Off,
        };
        let refused = |reason: String| WgpuError::RequestDevice { adapter: info.name.clone(), reason };
        #[cfg(not(target_vendor = "apple"))]
        let imported = if opts.no_host_import { None } else { crate::host_import::open_with_import(&adapter, &desc) };
        #[cfg(target_vendor = "apple")]
        let imported: Option<Result<(wgpu::Device, wgpu::Queue), String>> = None;
        let (device, queue) = match imported {
            Some(r) => r.map_err(refused)?,
            None => pollster::block_on(adapter.request_device(&desc)).map_err(|e| refused(e.to_string()))?,
        };
        let host_import_alignment = if opts.no_host_import { None } else { crate::host_import::import_alignment(&device) };
        // Errors outside an error scope land here instead of panicking; `check` reports them.
        let uncaptured = Arc::new(Mutex::new(Vec::new()));
        let sink = uncaptured.clone();
        device.on_uncaptured_error(Arc::new(move |e: wgpu::Error| {
            if let Ok(mut v) = sink.lock() {
                v.push(e.to_string());
            }
        }));
        let max_binding = limits.max_storage_buffer_binding_size.min(limits.max_buffer_size);
        let weight_binding = opts.max_binding_bytes.map_or(max_binding, |cap| cap.min(max_binding));
        let caps = Caps {
            adapter: info.name.clone(),
            backend: info.backend,
            device_type: info.device_type,
            driver: format!("{} {}", info.driver, info.driver_info),
            f16: features.contains(wgpu::Features::SHADER_F16),
            subgroup: features.contains(wgpu::Features::SUBGROUP),
            immediates: features.contains(wgpu::Features::IMMEDIATES),
            coop,
            f16_in_f32: adapter.get_downlevel_capabilities().flags.contains(wgpu::DownlevelFlags::SHADER_F16_IN_F32)
                && !opts.disable.contains(wgpu::Features::SHADER_F16),
            subgroup_min_size: info.subgroup_min_size,
            subgroup_max_size: info.subgroup_max_size,
            max_binding,
            weight_binding,
            max_buffer: limits.max_buffer_size,
            host_import_alignment,
        };
        let step = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("step"),
            size: STEP_BYTES as u64,
            usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let gpu = Self {
            device,
            queue,
            caps,
            counters: Arc::new(Counters::default()),
            uncaptured,
            step,
            pipelines: Mutex::new(HashMap::new()),
            iq2_grid: Mutex::new(None),
            runtime_checks: opts.runtime_checks,
            staged: std::sync::atomic::AtomicU64::new(0),
            profiler: None,
        };
        let gpu = Self { profiler: profile.then(|| Arc::new(crate::profile::Profiler::new(&gpu.device, &gpu.queue))), ..gpu };
        Counters::add(&gpu.counters.buffers, 1);
        Ok(gpu)
    }

    /// The device memory the driver reports (the largest device-local heap; on Metal the
    /// recommended working set), None where it reports none.
    pub fn memory_bytes(&self) -> Option<u64> {
        crate::host_import::device_local_bytes(&self.device)
    }

    /// Bytes of workgroup memory a compute workgroup may use.
    pub fn workgroup_memory(&self) -> u64 {
        self.device.limits().max_compute_workgroup_storage_size as u64
    }

    pub fn caps(&self) -> &Caps {
        &self.caps
    }

    pub fn counters(&self) -> CounterSnapshot {
        self.counters.snapshot()
    }

    /// Runs `f` inside validation and out-of-memory error scopes and returns the first error.
    pub(crate) fn scoped<T>(&self, op: &str, f: impl FnOnce(&wgpu::Device) -> T) -> Result<T, WgpuError> {
        let oom = self.device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        let val = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let out = f(&self.device);
        let v = pollster::block_on(val.pop());
        let o = pollster::block_on(oom.pop());
        match v.or(o) {
            Some(e) => Err(WgpuError::Device { op: op.to_string(), msg: e.to_string() }),
            None => self.check(op).map(|_| out),
        }
    }

    /// Reports (and clears) errors that reached the uncaptured-error handler.
    pub fn check(&self, op: &str) -> Result<(), WgpuError> {
        let mut v = self.uncaptured.lock().map_err(|_| WgpuError::Device { op: op.into(), msg: "error log poisoned".into() })?;
        if v.is_empty() {
            return Ok(());
        }
        let msg = v.join("; ");
        v.clear();
        Err(WgpuError::Device { op: op.to_string(), msg })
    }

    /// A WGSL module of this crate's kernels, with naga's runtime checks only if asked for.
    fn module(&self, d: &wgpu::Device, label: &str, wgsl: String) -> wgpu::ShaderModule {
        let desc = wgpu::ShaderModuleDescriptor { label: Some(label), source: wgpu::ShaderSource::Wgsl(wgsl.into()) };
        if self.runtime_checks {
            return d.create_shader_module(desc);
        }
        // SAFETY: the kernels are this crate's own WGSL (no loop runs unbounded: every loop walks a
        // range fixed by the op's shape), and every op checks its buffers' lengths against the shapes
        // its kernels index with before it binds them (ops tests: `errors.rs`, and every kernel against
        // the CPU with and without the checks, `ops_matvec::unchecked_kernels_match_checked`).
        unsafe { d.create_shader_module_trusted(desc, wgpu::ShaderRuntimeChecks::unchecked()) }
    }

    /// Compiles a WGSL compute module (entry point `main`) and reports its errors (diagnostics).
    pub fn check_wgsl(&self, label: &str, wgsl: &str) -> Result<(), WgpuError> {
        self.scoped(&format!("compiling {label}"), |d| {
            let module = self.module(d, label, wgsl.to_string());
            let _ = d.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                label: Some(label),
                layout: None,
                module: &module,
                entry_point: Some("main"),
                compilation_options: wgpu::PipelineCompilationOptions::default(),
                cache: None,
            });
        })
    }

    /// Checks a binding size against the adapter's limit.
    pub fn check_binding(&self, what: &str, bytes: u64) -> Result<(), WgpuError> {
        if bytes > self.caps.max_binding {
            return Err(WgpuError::BindingOverLimit { what: what.to_string(), bytes, limit: self.caps.max_binding });
        }
        Ok(())
    }

    /// The compute pipeline of a WGSL module (compiled once per key; later calls share it).
    pub(crate) fn pipeline(&self, key: &str, wgsl: impl FnOnce() -> Result<String, WgpuError>) -> Result<Arc<wgpu::ComputePipeline>, WgpuError> {
        let mut map = self.pipelines.lock().map_err(|_| WgpuError::Device { op: "pipeline cache".into(), msg: "poisoned".into() })?;
        if let Some(p) = map.get(key) {
            return Ok(p.clone());
        }
        let src = wgsl()?;
        let p = self.scoped(&format!("compiling kernel {key}"), |d| {
            let module = self.module(d, key, src);
            d.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                label: Some(key),
                layout: None,
                module: &module,
                entry_point: Some("main"),
                compilation_options: wgpu::PipelineCompilationOptions::default(),
                cache: None,
            })
        })?;
        Counters::add(&self.counters.pipelines, 1);
        let p = Arc::new(p);
        map.insert(key.to_string(), p.clone());
        Ok(p)
    }

    /// The IQ2_XXS grid table, uploaded at its first use (one per device).
    pub(crate) fn iq2_grid(&self) -> Result<Arc<wgpu::Buffer>, WgpuError> {
        let mut g = self.iq2_grid.lock().map_err(|_| WgpuError::Device { op: "grid table".into(), msg: "poisoned".into() })?;
        if let Some(b) = g.as_ref() {
            return Ok(b.clone());
        }
        let words = crate::shaders::iq2xxs_grid_words();
        let bytes: &[u8] = bytemuck::cast_slice(&words);
        let b = Arc::new(self.buffer_with("iq2_xxs grid", bytes, bytes.len() as u64, wgpu::BufferUsages::STORAGE)?);
        Counters::add(&self.counters.weight_uploads, 1);
        Counters::add(&self.counters.weight_bytes, bytes.len() as u64);
        *g = Some(b.clone());
        Ok(b)
    }

    /// A bind group over `buffers` (binding i = buffers[i], whole buffer), counted.
    pub(crate) fn bind_group(&self, label: &str, pipeline: &wgpu::ComputePipeline, buffers: &[&wgpu::Buffer]) -> Result<wgpu::BindGroup, WgpuError> {
        let bg = self.scoped(label, |d| {
            let entries: Vec<wgpu::BindGroupEntry> = buffers
                .iter()
                .enumerate()
                .map(|(i, b)| wgpu::BindGroupEntry { binding: i as u32, resource: b.as_entire_binding() })
                .collect();
            d.create_bind_group(&wgpu::BindGroupDescriptor { label: Some(label), layout: &pipeline.get_bind_group_layout(0), entries: &entries })
        })?;
        Counters::add(&self.counters.bind_groups, 1);
        Ok(bg)
    }

    /// A buffer of `size` bytes filled with `bytes` (zero-padded), written through a mapped-at-creation
    /// range (no staging buffer).
    pub(crate) fn buffer_with(&self, label: &str, bytes: &[u8], size: u64, usage: wgpu::BufferUsages) -> Result<wgpu::Buffer, WgpuError> {
        if size > self.caps.max_buffer {
            return Err(WgpuError::BindingOverLimit { what: label.to_string(), bytes: size, limit: self.caps.max_buffer });
        }
        let size = size.max(4).next_multiple_of(4);
        let buf = self.scoped(label, |d| d.create_buffer(&wgpu::BufferDescriptor { label: Some(label), size, usage, mapped_at_creation: true }))?;
        {
            let mut view = buf
                .slice(..)
                .get_mapped_range_mut()
                .map_err(|e| WgpuError::Device { op: format!("mapping {label}"), msg: e.to_string() })?;
            view.slice(..bytes.len()).copy_from_slice(bytes);
        }
        buf.unmap();
        Counters::add(&self.counters.buffers, 1);
        self.bound_staging(size)?;
        Ok(buf)
    }

    /// Counts `size` staged bytes; past `STAGING_FLUSH` runs the pending copies and waits, which frees
    /// their staging memory.
    fn bound_staging(&self, size: u64) -> Result<(), WgpuError> {
        use std::sync::atomic::Ordering;
        if self.staged.fetch_add(size, Ordering::Relaxed) + size < STAGING_FLUSH {
            return Ok(());
        }
        self.staged.store(0, Ordering::Relaxed);
        self.scoped("upload flush", |_| self.queue.submit(std::iter::empty::<wgpu::CommandBuffer>()))?;
        self.device
            .poll(wgpu::PollType::wait_indefinitely())
            .map_err(|e| WgpuError::Device { op: "upload flush".into(), msg: e.to_string() })?;
        self.check("weight upload")
    }

    /// A uniform buffer holding `bytes`.
    pub(crate) fn uniform(&self, label: &str, bytes: &[u8]) -> Result<wgpu::Buffer, WgpuError> {
        self.buffer_with(label, bytes, bytes.len() as u64, wgpu::BufferUsages::UNIFORM)
    }

    /// Test hook: runs a module whose only binding (0) is a storage buffer of `out_floats` f32 (zeroed),
    /// over `groups` workgroups, and returns the buffer: probes of what the driver does (e.g. the
    /// cooperative-matrix layouts, `tests/ops_matvec.rs`).
    #[doc(hidden)]
    pub fn run_probe(&self, key: &str, wgsl: &str, groups: u32, out_floats: usize) -> Result<Vec<f32>, WgpuError> {
        let out = crate::GpuBuffer::new(self, key, out_floats)?;
        let src = wgsl.to_string();
        let pipeline = self.pipeline(key, || Ok(src))?;
        let bind = self.bind_group(key, &pipeline, &[&out.buffer])?;
        self.run(Step { ntok: 1, pos: 0 }, |enc| {
            let pass = enc.pass();
            pass.set_pipeline(&pipeline);
            pass.set_bind_group(0, &bind, &[]);
            pass.dispatch_workgroups(groups, 1, 1);
            Ok(())
        })?;
        out.read(self, out_floats)
    }

    /// Records work through `f` and runs it with `step` (one 16-byte uniform write), waiting for it.
    pub fn run(&self, step: Step, f: impl FnOnce(&mut Encoder) -> Result<(), WgpuError>) -> Result<(), WgpuError> {
        let mut enc = self.begin(step);
        f(&mut enc)?;
        self.submit(enc)?;
        self.wait()
    }

    /// Starts recording a step: writes its uniform (ordered before the step's commands, which are
    /// submitted later by [`Gpu::submit`]).
    pub fn begin(&self, step: Step) -> Encoder {
        self.begin_slot(step, 0)
    }

    /// Writes the per-step uniform of one sequence (the session in KV slot `slot`), ordered before
    /// the commands of the next submission.
    pub(crate) fn write_step(&self, step: Step, slot: u32) {
        self.queue.write_buffer(&self.step, 0, bytemuck::cast_slice(&[step.ntok, step.pos, 0, slot]));
        Counters::add(&self.counters.step_writes, 1);
    }

    /// Starts recording a step of one sequence, the session in KV slot `slot`.
    pub fn begin_slot(&self, step: Step, slot: u32) -> Encoder {
        self.write_step(step, slot);
        let mut enc = Encoder::new(self, step);
        enc.seqs = Seqs::One { slot };
        enc
    }
    /// Starts recording a batched step: row r is one token of the session in KV slot `rows[r].0` at
    /// position `rows[r].1` (one uniform write, as any step).
    pub fn begin_batch(&self, rows: &[(u32, u32)]) -> Result<Encoder, WgpuError> {
        if rows.is_empty() || rows.len() > MAX_BATCH_ROWS {
            return Err(WgpuError::BadShape { what: "batched step".into(), reason: format!("{} rows (1 to {MAX_BATCH_ROWS})", rows.len()) });
        }
        let pos = rows.iter().map(|r| r.1).max().unwrap_or(0);
        let step = Step { ntok: rows.len() as u32, pos };
        let mut words = [0u32; STEP_BYTES / 4];
        words[..4].copy_from_slice(&[step.ntok, pos, 1, 0]);
        for (w, &(slot, p)) in words[4..].chunks_exact_mut(4).zip(rows) {
            w[0] = slot;
            w[1] = p;
        }
        let n = 4 + 4 * rows.len();
        self.queue.write_buffer(&self.step, 0, bytemuck::cast_slice(&words[..n]));
        Counters::add(&self.counters.step_writes, 1);
        let mut enc = Encoder::new(self, step);
        enc.seqs = Seqs::Batch;
        Ok(enc)
    }

    /// Submits a recorded step without waiting for it.
    pub fn submit(&self, enc: Encoder) -> Result<(), WgpuError> {
        // Errors recorded in passes surface when the encoder finishes.
        let (decode, record) = (enc.step.ntok == 1, enc.recorded.unwrap_or_else(|| enc.begun.elapsed()));
        let (cmd, marks) = self.scoped("recording", |_| enc.finish())?;
        self.scoped("submit", |_| self.queue.submit([cmd]))?;
        if let Some(p) = &self.profiler {
            p.submitted(decode, marks, record);
        }
        Counters::add(&self.counters.submits, 1);
        Ok(())
    }

    /// Blocks until the queue is idle.
    pub fn wait(&self) -> Result<(), WgpuError> {
        let t = std::time::Instant::now();
        self.device
            .poll(wgpu::PollType::wait_indefinitely())
            .map_err(|e| WgpuError::Device { op: "wait".into(), msg: e.to_string() })?;
        if let Some(p) = &self.profiler {
            p.waited(&self.device, t);
        }
        self.check("GPU work")
    }

    /// The profile since the last call (`DS4_WGPU_PROFILE=1`), None when not profiling.
    pub fn profile_report(&self) -> Option<String> {
        self.profiler.as_ref().and_then(|p| p.report())
    }

    /// Maps the first `size` bytes of a MAP_READ buffer (its copy recorded and submitted), waits, and
    /// hands them to `f`; unmaps after.
    pub(crate) fn map_read<R>(&self, staging: &wgpu::Buffer, size: u64, f: impl FnOnce(&[u8]) -> R) -> Result<R, WgpuError> {
        let err = |e: String| WgpuError::Device { op: "readback".into(), msg: e };
        let (tx, rx) = std::sync::mpsc::channel();
        staging.slice(..size).map_async(wgpu::MapMode::Read, move |r| {
            let _ = tx.send(r);
        });
        self.wait()?;
        rx.recv().map_err(|e| err(e.to_string()))?.map_err(|e| err(e.to_string()))?;
        let r = {
            let view = staging.slice(..size).get_mapped_range().map_err(|e| err(e.to_string()))?;
            f(&view)
        };
        staging.unmap();
        Ok(r)
    }

    /// Copies `size` bytes of `src` from `offset` back to the host (a staging buffer per call: for
    /// tests and one-off reads, not for the per-token path).
    pub(crate) fn read_bytes(&self, src: &wgpu::Buffer, offset: u64, size: u64) -> Result<Vec<u8>, WgpuError> {
        if size == 0 {
            return Ok(Vec::new());
        }
        let size4 = size.next_multiple_of(4);
        let staging = self.scoped("readback buffer", |d| {
            d.create_buffer(&wgpu::BufferDescriptor {
                label: Some("readback"),
                size: size4,
                usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            })
        })?;
        let mut enc = self.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("readback") });
        enc.copy_buffer_to_buffer(src, offset, &staging, 0, size4);
        self.scoped("readback copy", |_| self.queue.submit([enc.finish()]))?;
        Counters::add(&self.counters.submits, 1);
        self.map_read(&staging, size4, |v| v[..size as usize].to_vec())
    }
}
