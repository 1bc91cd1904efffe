//! Thin layer over the CUDA driver and cuBLAS (through cudarc's result-level API): one context, a main
//! stream and side streams, the kernel modules (compiled by `nvrtc.rs`), raw device pointers with
//! explicit ownership.
use cudarc::cublas::{result as blas, sys as bsys};
use cudarc::driver::{result as drv, sys as dsys};
use cudarc::nvrtc::sys as rsys;
use std::collections::HashMap;
use std::ffi::{c_void, CString};
use std::sync::atomic::{AtomicU64, Ordering};

pub type Result<T> = std::result::Result<T, String>;

/// Side streams: 1 and 2 carry the decode step's independent chains; all of them carry the prefill's
/// per-expert GEMMs (one GEMM of ~100 tokens fills a fraction of the SMs, several at once fill them).
pub const SIDE_STREAMS: usize = 6;

/// Device allocations made since start (the decode loop must make none).
pub static ALLOCS: AtomicU64 = AtomicU64::new(0);
/// Host-to-device copies of weights (done once, at load).
pub static WEIGHT_UPLOADS: AtomicU64 = AtomicU64::new(0);

pub(crate) fn e<E: std::fmt::Debug>(what: &str) -> impl FnOnce(E) -> String + '_ {
    move |err| format!("{what}: {err:?}")
}

/// Makes libnvrtc / libcublas findable: cudarc dlopens by soname, so preload them from the usual places.
pub fn preload_libs() {
    let dirs = [
        std::env::var("DS4_CUDA_LIB").unwrap_or_default(),
        "/usr/local/cuda/lib64".to_string(),
        "/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cu13/lib".to_string(),
    ];
    for d in dirs.iter().filter(|d| !d.is_empty()) {
        let Ok(rd) = std::fs::read_dir(d) else { continue };
        let mut names: Vec<_> = rd.filter_map(|x| x.ok()).map(|x| x.path()).collect();
        names.sort();
        for p in names {
            let n = p.file_name().and_then(|s| s.to_str()).unwrap_or("");
            if n.starts_with("libnvrtc-builtins.so.13") || n == "libnvrtc.so.13" || n == "libcublas.so.13" || n == "libcublasLt.so.13" {
                // SAFETY: loading a system CUDA library by absolute path; its initialisers are the vendor's.
                if let Ok(l) = unsafe { libloading::Library::new(&p) } {
                    std::mem::forget(l);
                }
            }
        }
    }
}

/// An owned device allocation.
pub struct DBuf {
    pub ptr: u64,
    pub bytes: usize,
}

impl DBuf {
    pub fn f32(&self, off: usize) -> u64 { self.ptr + 4 * off as u64 }
}

impl Drop for DBuf {
    fn drop(&mut self) {
        if self.ptr != 0 {
            // SAFETY: ptr came from cuMemAlloc in Gpu::alloc and is freed once.
            unsafe { let _ = drv::free_sync(self.ptr); }
        }
    }
}

/// Most arguments a kernel launch takes.
const MAX_ARGS: usize = 40;

/// A kernel argument (copied into the launch's argument block).
#[derive(Clone, Copy)]
pub enum A {
    P(u64),
    I(i32),
    L(i64),
    F(f32),
}

pub struct Gpu {
    /// cuBLAS workspaces, one per handle (declared first: freed before the context goes).
    _blas_ws: Vec<DBuf>,
    pub ctx: std::sync::Arc<cudarc::driver::CudaContext>,
    pub stream: dsys::CUstream,
    modules: Vec<dsys::CUmodule>,
    funcs: HashMap<&'static str, dsys::CUfunction>,
    /// The kernel modules being compiled (or read from the cache) on a background thread, started
    /// with the context so that compiling overlaps the weight upload; loaded at the first launch.
    pending: Option<std::thread::JoinHandle<Result<crate::nvrtc::ModuleImages>>>,
    /// The IQ2_XXS lattice, uploaded into each module that reads it when the modules load.
    iq2_grid: [u64; 256],
    /// cuBLAS handles: index 0 on the main stream, k on side stream k.
    blas: Vec<bsys::cublasHandle_t>,
    pub name: String,
    pub sms: i32,
    pub arch: String,
    /// Per-kernel timing (CUDA events) when profiling is on.
    pub prof: Option<Profiler>,
    /// Dynamic shared memory limit raised so far, per kernel.
    smem_set: HashMap<&'static str, u32>,
    /// Side streams for independent branches of a decode step (fork/join through events), and the
    /// stream kernels are launched on now (0 = the main stream).
    side: Vec<dsys::CUstream>,
    fork_ev: Vec<dsys::CUevent>,
    join_ev: Vec<dsys::CUevent>,
    cur: usize,
    /// Launches may carry programmatic dependent launch (common.cuh PDL_ENTRY): Hopper and later.
    pub pdl: bool,
    /// Whether launches now carry the PDL attribute (the stage sets it for one-token steps only:
    /// prefill measured no gain).
    pub pdl_now: bool,
    /// Kernels left out of one-token steps (DS4_CUDA_SKIP, names separated by , or :): a measuring aid
    /// only: the decode rate without a kernel bounds what making it faster can gain. Results are wrong.
    skip: Vec<String>,
}

pub struct Profiler {
    pending: Vec<(&'static str, dsys::CUevent, dsys::CUevent)>,
    pool: Vec<dsys::CUevent>,
    pub totals: HashMap<&'static str, (f64, u64)>,
    /// Profile labels of GEMM shapes ("gemm MxNxK"), made once per shape.
    labels: HashMap<(usize, usize, usize), &'static str>,
}

impl Profiler {
    pub fn new() -> Self { Self { pending: Vec::new(), pool: Vec::new(), totals: HashMap::new(), labels: HashMap::new() } }
}

impl Default for Profiler {
    fn default() -> Self { Self::new() }
}

impl Gpu {
    /// Opens device 0, compiles (or loads from the cache) the kernels, creates the cuBLAS handle.
    pub fn new(iq2_grid: &[u64; 256]) -> Result<Self> { Self::on_device(iq2_grid, 0) }

    /// Opens CUDA device `device` (its primary context).
    pub fn on_device(iq2_grid: &[u64; 256], device: usize) -> Result<Self> {
        preload_libs();
        // SAFETY: probing for libcuda.
        if !unsafe { dsys::is_culib_present() } {
            return Err("no CUDA driver (libcuda) found: --backend cuda needs an NVIDIA GPU and its driver".into());
        }
        let n = cudarc::driver::CudaContext::device_count().map_err(|err| format!("no usable CUDA device: {err:?}"))?;
        if device >= n as usize {
            return Err(format!("CUDA device {device} does not exist ({n} present)"));
        }
        let ctx = cudarc::driver::CudaContext::new(device).map_err(|err| format!("no usable CUDA device {device}: {err:?}"))?;
        // SAFETY: the context is ours; we synchronise explicitly and never use cudarc's event tracking.
        unsafe { ctx.disable_event_tracking() };
        let (maj, min) = ctx.compute_capability().map_err(e("compute capability"))?;
        let name = ctx.name().unwrap_or_default();
        let sms = ctx.attribute(dsys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT).unwrap_or(0);
        let arch = if maj == 9 && min == 0 { "sm_90a".to_string() } else { format!("sm_{maj}{min}") };
        ctx.bind_to_thread().map_err(e("bind context"))?;
        let stream = drv::stream::create(drv::stream::StreamKind::NonBlocking).map_err(e("stream"))?;
        if !unsafe { rsys::is_culib_present() } {
            return Err("libnvrtc.so.13 not found: set LD_LIBRARY_PATH to the CUDA toolkit's lib64 (or DS4_CUDA_LIB)".into());
        }
        crate::nvrtc::check_arch(&arch)?;
        let arch_bg = arch.clone();
        let pending = Some(std::thread::spawn(move || crate::nvrtc::module_images(&arch_bg)));
        let prof = std::env::var("DS4_CUDA_PROFILE").ok().filter(|v| v != "0").map(|_| Profiler::new());
        let mk_stream = || drv::stream::create(drv::stream::StreamKind::NonBlocking).map_err(e("stream"));
        let mk_ev = || drv::event::create(dsys::CUevent_flags::CU_EVENT_DISABLE_TIMING).map_err(e("event"));
        let (mut side, mut fork_ev, mut join_ev) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..SIDE_STREAMS {
            side.push(mk_stream()?);
            fork_ev.push(mk_ev()?);
            join_ev.push(mk_ev()?);
        }
        let mut handles = Vec::new();
        for st in std::iter::once(stream).chain(side.iter().copied()) {
            let h = blas::create_handle().map_err(e("cublasCreate"))?;
            // SAFETY: handle and stream are live.
            unsafe { blas::set_stream(h, st as _) }.map_err(e("cublasSetStream"))?;
            handles.push(h);
        }
        // An explicit workspace per handle: without one, some GEMM shapes took milliseconds of host
        // time per call inside cuBLAS (seen as the GPU idling at 512x4096x4096 in prefill profiles).
        let mut ws = Vec::new();
        for &h in &handles {
            ALLOCS.fetch_add(1, Ordering::Relaxed);
            const WS: usize = 32 << 20;
            // SAFETY: plain device allocation, owned by the DBuf below.
            let ptr = unsafe { drv::malloc_sync(WS) }.map_err(e("cuBLAS workspace"))?;
            ws.push(DBuf { ptr, bytes: WS });
            // SAFETY: live handle; the workspace outlives it (freed after the handles are destroyed).
            unsafe { bsys::cublasSetWorkspace_v2(h, ptr as *mut c_void, WS) }.result().map_err(e("cublasSetWorkspace"))?;
        }
        // Always on where supported since the products fetch their first weights before waiting: flash:6
        // decode 666.7 / 669.2 t/s with, 643.6 / 640.2 without (same run, 2026-12-03).
        let pdl = maj >= 9;
        let skip = std::env::var("DS4_CUDA_SKIP").map(|v| v.split([',', ':']).filter(|n| !n.is_empty()).map(String::from).collect()).unwrap_or_default();
        Ok(Self { skip, pdl, _blas_ws: ws, ctx, stream, modules: Vec::new(), funcs: HashMap::new(), pending, iq2_grid: *iq2_grid, blas: handles, name, sms, arch, prof, smem_set: HashMap::new(), side, fork_ev, join_ev, cur: 0, pdl_now: false })
    }

    /// Kernel `name` (the modules are loaded first if they are not yet).
    fn func(&mut self, name: &'static str) -> Result<dsys::CUfunction> {
        if self.pending.is_some() {
            self.kernels_ready()?;
        }
        self.funcs.get(name).copied().ok_or_else(|| format!("unknown kernel {name}"))
    }

    /// Waits for the kernel modules (compiled or read from the cache since the context was made) and
    /// loads them; the first launch does this by itself. Needs this GPU's context on the calling thread.
    pub fn kernels_ready(&mut self) -> Result<()> {
        if self.pending.is_none() {
            return Ok(());
        }
        // Loading a module and uploading the lattice synchronise, which a stream capture forbids.
        // SAFETY: our main stream, created in `on_device`.
        let capturing = unsafe { drv::stream::is_capturing(self.stream) }.map_err(e("cuStreamIsCapturing"))?;
        if capturing != dsys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE {
            return Err("kernel modules loaded during a CUDA graph capture: call Gpu::kernels_ready before capturing".into());
        }
        let Some(job) = self.pending.take() else { return Ok(()) };
        let imgs = job.join().map_err(|_| "the kernel compile thread panicked".to_string())??;
        let (modules, funcs) = load_modules(&self.arch, &imgs)?;
        self.modules = modules;
        self.funcs = funcs;
        // The IQ2_XXS lattice (common.cuh), in each module whose kernels read it.
        for &module in &self.modules {
            // SAFETY: module loaded; the name is a NUL-terminated C string.
            let Ok((gptr, gbytes)) = (unsafe { drv::module::get_global(module, c"iq2xxs_grid".to_owned()) }) else { continue };
            if gbytes != 256 * 8 {
                return Err("iq2xxs_grid size mismatch".into());
            }
            // SAFETY: gptr is a 2 KiB device symbol; the host slice has the same size.
            unsafe { drv::memcpy_htod_sync(gptr, &self.iq2_grid[..]) }.map_err(e("upload iq2 grid"))?;
        }
        Ok(())
    }

    /// Makes this GPU's context current on the calling thread (a no-op when it already is).
    pub fn bind(&self) -> Result<()> { self.ctx.bind_to_thread().map_err(e("bind context")) }

    pub fn alloc(&self, bytes: usize) -> Result<DBuf> {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        let b = bytes.max(256);
        // SAFETY: plain device allocation; owned by the returned DBuf.
        let ptr = unsafe { drv::malloc_sync(b) }.map_err(|err| format!("cuMemAlloc of {:.2} GiB failed: {err:?}", b as f64 / (1u64 << 30) as f64))?;
        Ok(DBuf { ptr, bytes: b })
    }

    pub fn alloc_zeroed(&self, bytes: usize) -> Result<DBuf> {
        let b = self.alloc(bytes)?;
        // SAFETY: b.ptr owns b.bytes bytes.
        unsafe { drv::memset_d8_sync(b.ptr, 0, b.bytes) }.map_err(e("memset"))?;
        Ok(b)
    }

    pub fn htod<T>(&self, dst: u64, src: &[T]) -> Result<()> {
        // SAFETY: callers pass a destination with at least size_of_val(src) bytes; the async copy from
        // pageable memory is staged by the driver before returning.
        unsafe { drv::memcpy_htod_async(dst, src, self.stream) }.map_err(e("memcpy htod"))
    }

    pub fn dtoh<T>(&self, dst: &mut [T], src: u64) -> Result<()> {
        // SAFETY: src holds at least size_of_val(dst) bytes; we synchronise before the host reads.
        unsafe { drv::memcpy_dtoh_async(dst, src, self.stream) }.map_err(e("memcpy dtoh"))?;
        self.sync()
    }

    pub fn dtod(&self, dst: u64, src: u64, bytes: usize) -> Result<()> {
        // SAFETY: both ranges are live device allocations of at least `bytes`.
        unsafe { drv::memcpy_dtod_async(dst, src, bytes, self.stream) }.map_err(e("memcpy dtod"))
    }

    pub fn sync(&self) -> Result<()> {
        // SAFETY: our stream.
        unsafe { drv::stream::synchronize(self.stream) }.map_err(|err| format!("CUDA error: {err:?}"))
    }

    /// Raises the dynamic shared memory limit of kernel `name` to `smem` bytes (ahead of launches).
    pub fn reserve_smem(&mut self, name: &'static str, smem: u32) -> Result<()> {
        let f = self.func(name)?;
        if smem > 40 * 1024 && self.smem_set.get(name).is_none_or(|&v| v < smem) {
            // SAFETY: f is a kernel of our module; raising its dynamic shared memory limit.
            unsafe {
                drv::function::set_function_attribute(f, dsys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem as i32)
            }
            .map_err(e("smem attribute"))?;
            self.smem_set.insert(name, smem);
        }
        Ok(())
    }

    /// Average seconds per call of `f` over `reps` back-to-back calls, timed with CUDA events.
    pub fn time(&mut self, reps: usize, mut f: impl FnMut(&mut Self) -> Result<()>) -> Result<f64> {
        // Loading the modules at the first launch would fall between the events.
        self.kernels_ready()?;
        let a = drv::event::create(dsys::CUevent_flags::CU_EVENT_DEFAULT).map_err(e("event"))?;
        let b = drv::event::create(dsys::CUevent_flags::CU_EVENT_DEFAULT).map_err(e("event"))?;
        // SAFETY: live events recorded on our stream; synchronised before reading the elapsed time.
        let ms = unsafe {
            drv::event::record(a, self.stream).map_err(e("record"))?;
            for _ in 0..reps {
                f(self)?;
            }
            drv::event::record(b, self.stream).map_err(e("record"))?;
            self.sync()?;
            let ms = drv::event::elapsed(a, b).map_err(e("elapsed"))?;
            let _ = drv::event::destroy(a);
            let _ = drv::event::destroy(b);
            ms
        };
        Ok(ms as f64 / 1e3 / reps.max(1) as f64)
    }

    /// The stream launches go to now.
    fn cur_stream(&self) -> dsys::CUstream {
        if self.cur == 0 {
            self.stream
        } else {
            self.side[self.cur - 1]
        }
    }

    /// Starts an independent branch: later launches go to side stream `k` (1..=SIDE_STREAMS), which first waits
    /// for everything issued so far on the main stream.
    pub fn fork(&mut self, k: usize) -> Result<()> {
        let (ev, st) = (self.fork_ev[k - 1], self.side[k - 1]);
        // SAFETY: live event and streams created in `new`.
        unsafe {
            drv::event::record(ev, self.stream).map_err(e("record"))?;
            drv::stream::wait_event(st, ev, dsys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT).map_err(e("wait event"))?;
        }
        self.cur = k;
        Ok(())
    }

    /// Ends branch `k`: the main stream waits for the side stream's work; launches go to main again.
    pub fn join(&mut self, k: usize) -> Result<()> {
        let (ev, st) = (self.join_ev[k - 1], self.side[k - 1]);
        // SAFETY: live event and streams created in `new`.
        unsafe {
            drv::event::record(ev, st).map_err(e("record"))?;
            drv::stream::wait_event(self.stream, ev, dsys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT).map_err(e("wait event"))?;
        }
        self.cur = 0;
        Ok(())
    }

    /// Continues on the main stream without waiting (the branch is joined later with `join`).
    pub fn to_main(&mut self) { self.cur = 0; }

    /// Launches go to side stream `k` (already forked), without a new dependency; 0 = main.
    pub fn on(&mut self, k: usize) { self.cur = k.min(self.side.len()); }

    /// The stream launches go to now (0 = main, k = side stream k).
    pub fn current(&self) -> usize { self.cur }

    /// Forks every side stream from the main stream (each waits for the work issued so far).
    pub fn fork_all(&mut self) -> Result<()> {
        for k in 1..=self.side.len() {
            self.fork(k)?;
        }
        self.cur = 0;
        Ok(())
    }

    /// Joins every side stream into the main stream; launches go to main again.
    pub fn join_all(&mut self) -> Result<()> {
        for k in 1..=self.side.len() {
            self.join(k)?;
        }
        Ok(())
    }

    /// Launches kernel `name`; grid/block as (x, y, z).
    pub fn launch(&mut self, name: &'static str, grid: (u32, u32, u32), block: u32, smem: u32, args: &[A]) -> Result<()> {
        if grid.0 == 0 || grid.1 == 0 || grid.2 == 0 {
            return Ok(());
        }
        let f = self.func(name)?;
        if self.pdl_now && !self.skip.is_empty() && self.skip.iter().any(|s| s == name) {
            return Ok(());
        }
        if args.len() > MAX_ARGS {
            return Err(format!("kernel {name}: more than {MAX_ARGS} arguments"));
        }
        // Fixed-size argument block on the stack: a launch allocates nothing.
        let mut store: [u64; MAX_ARGS] = [0; MAX_ARGS];
        let mut ptrs: [*mut c_void; MAX_ARGS] = [std::ptr::null_mut(); MAX_ARGS];
        for (i, a) in args.iter().enumerate() {
            let slot = &mut store[i] as *mut u64;
            // SAFETY: each slot is 8 bytes; we write the argument's bytes at its start (little-endian).
            unsafe {
                match *a {
                    A::P(p) => *slot = p,
                    A::L(v) => *(slot as *mut i64) = v,
                    A::I(v) => *(slot as *mut i32) = v,
                    A::F(v) => *(slot as *mut f32) = v,
                }
            }
            ptrs[i] = slot as *mut c_void;
        }
        let ev = self.prof_begin(name)?;
        self.reserve_smem(name, smem)?;
        // SAFETY (both branches): argument pointers point into `store`, which lives across the call;
        // the kernel's parameter list matches `args` (each call site mirrors the kernel signature).
        if self.pdl && self.pdl_now {
            // SAFETY: as above; the launch config and its one attribute live across the call.
            unsafe {
                let mut attr: dsys::CUlaunchAttribute = std::mem::zeroed();
                attr.id = dsys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
                attr.value.programmaticStreamSerializationAllowed = 1;
                let cfg = dsys::CUlaunchConfig {
                    gridDimX: grid.0,
                    gridDimY: grid.1,
                    gridDimZ: grid.2,
                    blockDimX: block,
                    blockDimY: 1,
                    blockDimZ: 1,
                    sharedMemBytes: smem,
                    hStream: self.cur_stream(),
                    attrs: &mut attr,
                    numAttrs: 1,
                };
                dsys::cuLaunchKernelEx(&cfg, f, ptrs.as_mut_ptr(), std::ptr::null_mut()).result()
            }
            .map_err(|err| format!("launch {name}: {err:?}"))?;
        } else {
            // SAFETY: argument pointers point into `store`, which lives across the call; the kernel's
            // parameter list matches `args` (each call site mirrors the kernel signature in its .cu file).
            unsafe { drv::launch_kernel(f, grid, (block, 1, 1), smem, self.cur_stream(), &mut ptrs[..args.len()]) }.map_err(|err| format!("launch {name}: {err:?}"))?;
        }
        self.prof_end(name, ev)?;
        Ok(())
    }

    fn prof_begin(&mut self, _name: &'static str) -> Result<Option<dsys::CUevent>> {
        let st = self.cur_stream();
        let Some(p) = self.prof.as_mut() else { return Ok(None) };
        let ev = match p.pool.pop() {
            Some(x) => x,
            None => drv::event::create(dsys::CUevent_flags::CU_EVENT_DEFAULT).map_err(e("event"))?,
        };
        // SAFETY: live event and stream.
        unsafe { drv::event::record(ev, st) }.map_err(e("record"))?;
        Ok(Some(ev))
    }

    fn prof_end(&mut self, name: &'static str, start: Option<dsys::CUevent>) -> Result<()> {
        let st = self.cur_stream();
        let (Some(p), Some(s)) = (self.prof.as_mut(), start) else { return Ok(()) };
        let ev = match p.pool.pop() {
            Some(x) => x,
            None => drv::event::create(dsys::CUevent_flags::CU_EVENT_DEFAULT).map_err(e("event"))?,
        };
        // SAFETY: live event and stream.
        unsafe { drv::event::record(ev, st) }.map_err(e("record"))?;
        p.pending.push((name, s, ev));
        Ok(())
    }

    /// Named region for the profiler (e.g. cuBLAS calls).
    pub fn region<T>(&mut self, name: &'static str, f: impl FnOnce(&mut Self) -> Result<T>) -> Result<T> {
        let ev = self.prof_begin(name)?;
        let r = f(self)?;
        self.prof_end(name, ev)?;
        Ok(r)
    }

    /// Folds finished event pairs into the per-kernel totals (synchronises).
    pub fn prof_collect(&mut self) -> Result<()> {
        if self.prof.is_none() {
            return Ok(());
        }
        self.sync()?;
        let p = self.prof.as_mut().unwrap();
        for (name, a, b) in p.pending.drain(..) {
            // SAFETY: both events were recorded on our stream, which is synchronised.
            let ms = unsafe { drv::event::elapsed(a, b) }.map_err(e("elapsed"))? as f64;
            let t = p.totals.entry(name).or_insert((0.0, 0));
            t.0 += ms;
            t.1 += 1;
            p.pool.push(a);
            p.pool.push(b);
        }
        Ok(())
    }

    pub fn prof_report(&mut self) -> Option<String> {
        self.prof_collect().ok()?;
        let p = self.prof.as_mut()?;
        let mut v: Vec<_> = p.totals.iter().map(|(k, v)| (*k, *v)).collect();
        v.sort_by(|a, b| b.1 .0.partial_cmp(&a.1 .0).unwrap());
        let total: f64 = v.iter().map(|x| x.1 .0).sum();
        let mut s = format!("cuda profile (CUDA events per kernel; total {total:.1} ms)\n");
        for (k, (ms, n)) in v.iter().take(25) {
            s += &format!("  {k:<16} {ms:>10.2} ms {:>5.1}%  {n:>8} calls  {:>8.2} us/call\n", 100.0 * ms / total.max(1e-9), 1000.0 * ms / *n as f64);
        }
        p.totals.clear();
        Some(s)
    }

    /// C (m×n, col-major, f32, ldc) = A^T·B with A k×m col-major f16 (lda), B k×n col-major f16 (ldb).
    /// In row-major terms: Y (n×m, ldc) = X (n×k) · W^T with W m×k row-major.
    pub fn gemm_f16(&mut self, m: usize, n: usize, k: usize, a: u64, lda: usize, b: u64, ldb: usize, c: u64, ldc: usize) -> Result<()> {
        let alpha = 1.0f32;
        let beta = 0.0f32;
        let h = self.blas[self.cur];
        // Profiling labels each GEMM shape (a few dozen per model, leaked once).
        let label = match self.prof.as_mut() {
            Some(p) => *p.labels.entry((m, n, k)).or_insert_with(|| Box::leak(format!("gemm {m}x{n}x{k}").into_boxed_str())),
            None => "cublas_gemm",
        };
        self.region(label, |_| {
            // SAFETY: pointers are live device buffers sized by the caller for these dimensions; alpha/beta are host scalars.
            unsafe {
                blas::gemm_ex(
                    h,
                    bsys::cublasOperation_t::CUBLAS_OP_T,
                    bsys::cublasOperation_t::CUBLAS_OP_N,
                    m as i32,
                    n as i32,
                    k as i32,
                    &alpha as *const f32 as *const c_void,
                    a as *const c_void,
                    bsys::cudaDataType::CUDA_R_16F,
                    lda as i32,
                    b as *const c_void,
                    bsys::cudaDataType::CUDA_R_16F,
                    ldb as i32,
                    &beta as *const f32 as *const c_void,
                    c as *mut c_void,
                    bsys::cudaDataType::CUDA_R_32F,
                    ldc as i32,
                    bsys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                    bsys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
                )
            }
            .map_err(|err| format!("cublasGemmEx: {err:?}"))
        })
    }

    /// Copies host byte ranges to device pointers through two pinned staging buffers (parallel host
    /// copies, asynchronous DMA), reporting progress.
    pub fn upload(&self, items: &[(u64, &[u8])], mut progress: impl FnMut(u64, u64)) -> Result<()> {
        let total: u64 = items.iter().map(|x| x.1.len() as u64).sum();
        let mut staging = crate::staging::HostStaging::new(256 << 20)?;
        let mut done = 0u64;
        for &(dst, src) in items {
            WEIGHT_UPLOADS.fetch_add(1, Ordering::Relaxed);
            staging.htod(self, dst, src, |d| progress(done + d as u64, total))?;
            done += src.len() as u64;
        }
        self.sync()
    }
}

impl Drop for Gpu {
    fn drop(&mut self) {
        // A compile still running finishes (and writes its cache entries) before the context goes.
        if let Some(job) = self.pending.take() {
            let _ = job.join();
        }
        // SAFETY: destroying the handles this struct created, after the stream drains.
        unsafe {
            let _ = drv::stream::synchronize(self.stream);
            for &h in &self.blas {
                let _ = blas::destroy_handle(h);
            }
            for &m in &self.modules {
                let _ = drv::module::unload(m);
            }
            let _ = drv::stream::destroy(self.stream);
            for k in 0..self.side.len() {
                let _ = drv::stream::synchronize(self.side[k]);
                let _ = drv::stream::destroy(self.side[k]);
                let _ = drv::event::destroy(self.fork_ev[k]);
                let _ = drv::event::destroy(self.join_ev[k]);
            }
        }
    }
}

/// Loads every kernel module for `arch` (from the cache or compiled now) and looks up its kernels.
/// A cached image the driver refuses is compiled again once.
#[allow(clippy::type_complexity)]
fn load_modules(arch: &str, imgs: &crate::nvrtc::ModuleImages) -> Result<(Vec<dsys::CUmodule>, HashMap<&'static str, dsys::CUfunction>)> {
    let mut modules = Vec::new();
    let mut funcs = HashMap::new();
    for (i, (m, img)) in crate::MODULES.iter().zip(&imgs.images).enumerate() {
        // SAFETY: img is a CUBIN image (NVRTC output, or a cache entry whose checksum matched); the
        // driver validates it, and the Vec outlives the call.
        let module = match unsafe { drv::module::load_data(img.as_ptr() as *const c_void) } {
            Ok(md) => md,
            Err(err) if !imgs.cached[i] => return Err(format!("cuModuleLoadData {}: {err:?}", m.name)),
            Err(err) => {
                eprintln!("cuda: cached kernel module {} did not load ({err:?}); compiling it again", m.name);
                let img = crate::nvrtc::recompile(i, arch)?;
                // SAFETY: as above, a fresh NVRTC image.
                unsafe { drv::module::load_data(img.as_ptr() as *const c_void) }.map_err(|err| format!("cuModuleLoadData {}: {err:?}", m.name))?
            }
        };
        modules.push(module);
        for &n in m.kernels {
            let cn = CString::new(n).map_err(e("kernel name"))?;
            // SAFETY: module is loaded; names are the extern "C" kernels of its source.
            let f = unsafe { drv::module::get_function(module, cn) }.map_err(|err| format!("kernel {n} in module {}: {err:?}", m.name))?;
            funcs.insert(n, f);
        }
    }
    Ok((modules, funcs))
}
