//! Kernel modules compiled by NVRTC for the device's architecture: one program per module, the
//! missing ones compiled on parallel threads, each kept in the on-disk cache ([`crate::kernel_cache`]).
use crate::kernel_cache;
use crate::{KernelModule, MODULES};
use cudarc::nvrtc::{result as rtc, sys as rsys};
use std::ffi::CString;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};

pub type Result<T> = std::result::Result<T, String>;

/// True when libnvrtc can be loaded (compile checks skip otherwise).
pub fn nvrtc_present() -> bool {
    crate::gpu::preload_libs();
    // SAFETY: only probes whether the dynamic library can be opened.
    unsafe { rsys::is_culib_present() }
}

/// NVRTC's version as "major.minor" (part of the cache key: another compiler may emit other code).
pub fn nvrtc_version() -> Result<String> {
    let (mut major, mut minor) = (0, 0);
    // SAFETY: two valid out-pointers.
    unsafe { rsys::nvrtcVersion(&mut major, &mut minor) }.result().map_err(|err| format!("nvrtcVersion: {err:?}"))?;
    Ok(format!("{major}.{minor}"))
}

/// Fails, naming what to do, when this NVRTC cannot compile for `arch` ("sm_90a", "sm_80"): checked
/// before the weights load, since the kernels are compiled beside the upload.
pub fn check_arch(arch: &str) -> Result<()> {
    let n: i32 = arch.trim_start_matches("sm_").trim_end_matches(|c: char| c.is_ascii_alphabetic()).parse().map_err(|_| format!("unknown GPU architecture {arch}"))?;
    let mut count = 0i32;
    // SAFETY: valid out-pointer.
    unsafe { rsys::nvrtcGetNumSupportedArchs(&mut count) }.result().map_err(|err| format!("nvrtcGetNumSupportedArchs: {err:?}"))?;
    let mut archs = vec![0i32; count.max(0) as usize];
    // SAFETY: archs holds the `count` entries NVRTC reported.
    unsafe { rsys::nvrtcGetSupportedArchs(archs.as_mut_ptr()) }.result().map_err(|err| format!("nvrtcGetSupportedArchs: {err:?}"))?;
    if archs.contains(&n) {
        return Ok(());
    }
    let list: Vec<String> = archs.iter().map(|a| format!("sm_{a}")).collect();
    Err(format!("NVRTC {} cannot compile for this GPU ({arch}; it knows {}): point DS4_CUDA_LIB at a newer CUDA toolkit's lib64", nvrtc_version().unwrap_or_default(), list.join(" ")))
}

/// Include directories for NVRTC (our sources need no headers; the toolkit's are passed when present).
fn include_dirs() -> Vec<String> {
    let mut v = Vec::new();
    for d in [std::env::var("DS4_CUDA_INCLUDE").unwrap_or_default(), "/usr/local/cuda/include".into()] {
        if !d.is_empty() && std::path::Path::new(&d).is_dir() {
            v.push(d);
        }
    }
    v
}

/// The NVRTC options for `arch` (e.g. "sm_90a").
pub fn options(arch: &str) -> Vec<String> {
    let mut opts = vec![format!("--gpu-architecture={arch}"), "--std=c++17".to_string(), "-default-device".to_string()];
    for d in include_dirs() {
        opts.push(format!("--include-path={d}"));
    }
    opts
}

/// Compiles `src` to a CUBIN for `arch` with NVRTC.
pub fn compile_cubin(src: &str, arch: &str) -> Result<Vec<u8>> { compile_with(src, "ds4_kernels.cu", &options(arch)) }

fn compile_with(src: &str, file: &str, opts: &[String]) -> Result<Vec<u8>> {
    let csrc = CString::new(src).map_err(|err| format!("kernel source: {err}"))?;
    let cname = CString::new(file).map_err(|err| format!("kernel file name: {err}"))?;
    let prog = rtc::create_program(&csrc, Some(&cname)).map_err(|err| format!("nvrtcCreateProgram: {err:?}"))?;
    // SAFETY: prog is a live program created above; options are valid C strings.
    let res = unsafe { rtc::compile_program(prog, opts) };
    if let Err(err) = res {
        // SAFETY: prog is live; the log is a NUL-terminated buffer owned by the returned Vec.
        let log = unsafe { rtc::get_program_log(prog) }.map(|l| l.iter().map(|&c| c as u8 as char).collect::<String>()).unwrap_or_default();
        // SAFETY: destroying the program we created.
        unsafe { let _ = rtc::destroy_program(prog); }
        return Err(format!("NVRTC compile of {file} ({}) failed ({err:?}):\n{log}", opts.join(" ")));
    }
    let mut size = 0usize;
    // SAFETY: prog compiled successfully; size is a valid out-pointer.
    let got = unsafe { rsys::nvrtcGetCUBINSize(prog, &mut size) }.result().map_err(|err| format!("nvrtcGetCUBINSize: {err:?}"));
    let mut cubin = vec![0u8; size];
    // SAFETY: cubin has exactly `size` bytes as reported by NVRTC.
    let got = got.and_then(|_| unsafe { rsys::nvrtcGetCUBIN(prog, cubin.as_mut_ptr() as *mut _) }.result().map_err(|err| format!("nvrtcGetCUBIN: {err:?}")));
    // SAFETY: destroying the program we created, once.
    unsafe { let _ = rtc::destroy_program(prog); }
    got.map(|_| cubin)
}

/// Compiles `modules` for `arch` on up to `threads` threads, taking them in the given order
/// ([`MODULES`] lists the slowest first); images in the order of `modules`.
pub fn compile_modules(modules: &[&KernelModule], arch: &str, threads: usize) -> Result<Vec<Vec<u8>>> {
    let opts = options(arch);
    let next = AtomicUsize::new(0);
    let mut out: Vec<Option<Result<Vec<u8>>>> = (0..modules.len()).map(|_| None).collect();
    let threads = threads.clamp(1, modules.len().max(1));
    let results: Vec<Vec<(usize, Result<Vec<u8>>)>> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| {
                    let mut done = Vec::new();
                    loop {
                        let k = next.fetch_add(1, Ordering::Relaxed);
                        let Some(m) = modules.get(k) else { break };
                        done.push((k, compile_with(m.src, &format!("{}.cu", m.name), &opts)));
                    }
                    done
                })
            })
            .collect();
        workers.into_iter().map(|w| w.join().unwrap_or_default()).collect()
    });
    for (i, r) in results.into_iter().flatten() {
        out[i] = Some(r);
    }
    out.into_iter().enumerate().map(|(i, r)| r.unwrap_or_else(|| Err(format!("module {}: compile thread failed", modules[i].name)))).collect()
}

/// Threads for compiling: one per core, at most 16 (beyond that the largest module, ~1.4 s of the
/// ~12 s in all, bounds the time, and each compile holds its own memory).
pub fn compile_threads() -> usize { std::thread::available_parallelism().map_or(4, |n| n.get()).min(16) }

/// Where the images of the modules come from.
pub struct ModuleImages {
    /// One CUBIN per entry of [`MODULES`].
    pub images: Vec<Vec<u8>>,
    /// Which images came from the cache (the rest were compiled now).
    pub cached: Vec<bool>,
    /// Seconds spent compiling.
    pub compile_s: f64,
    /// The cache directory, when there is one.
    pub cache: Option<PathBuf>,
}

/// The cache entry path of module `m` for `arch` (None without a cache directory).
pub fn entry_path(m: &KernelModule, arch: &str, version: &str) -> Option<PathBuf> {
    let dir = kernel_cache::cache_dir(|k| std::env::var(k).ok())?;
    let opts = options(arch).join("\n");
    let k = kernel_cache::key(&[m.src.as_bytes(), opts.as_bytes(), arch.as_bytes(), version.as_bytes()]);
    Some(dir.join(kernel_cache::entry_name(m.name, arch, k)))
}

/// Every module's CUBIN for `arch`: intact cache entries are read, the others compiled in parallel
/// and written back (a cache that cannot be written is reported once and otherwise ignored).
/// One at a time in a process: the GPUs of a pipeline start together, and the second then finds
/// the first one's cache entries instead of compiling everything again beside it.
pub fn module_images(arch: &str) -> Result<ModuleImages> {
    static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let version = nvrtc_version()?;
    let paths: Vec<Option<PathBuf>> = MODULES.iter().map(|m| entry_path(m, arch, &version)).collect();
    let mut images: Vec<Option<Vec<u8>>> = paths.iter().map(|p| p.as_deref().and_then(kernel_cache::load)).collect();
    let cached: Vec<bool> = images.iter().map(Option::is_some).collect();
    let missing: Vec<usize> = (0..MODULES.len()).filter(|&i| !cached[i]).collect();
    let t0 = std::time::Instant::now();
    if !missing.is_empty() {
        let mods: Vec<&KernelModule> = missing.iter().map(|&i| &MODULES[i]).collect();
        let built = compile_modules(&mods, arch, compile_threads())?;
        let mut warned = false;
        for (&i, img) in missing.iter().zip(built) {
            if let Some(p) = &paths[i] {
                if let Err(err) = kernel_cache::store(p, &img) {
                    if !std::mem::replace(&mut warned, true) {
                        eprintln!("cuda: kernel cache {} not written ({err}); kernels will be compiled again next start", p.display());
                    }
                }
            }
            images[i] = Some(img);
        }
    }
    let compile_s = t0.elapsed().as_secs_f64();
    let cache = paths.iter().flatten().next().and_then(|p| p.parent().map(PathBuf::from));
    if !missing.is_empty() {
        let at = cache.as_ref().map_or("no cache directory: set DS4_CUDA_CACHE".to_string(), |d| format!("cached in {}", d.display()));
        eprintln!("cuda: compiled {} of {} kernel modules for {arch} in {compile_s:.2} s ({at})", missing.len(), MODULES.len());
    }
    Ok(ModuleImages { images: images.into_iter().map(|i| i.unwrap_or_default()).collect(), cached, compile_s, cache })
}

/// Compiles module `i` again (its cached image failed to load) and rewrites its cache entry.
pub fn recompile(i: usize, arch: &str) -> Result<Vec<u8>> {
    let m = &MODULES[i];
    let img = compile_with(m.src, &format!("{}.cu", m.name), &options(arch))?;
    if let Some(p) = entry_path(m, arch, &nvrtc_version()?) {
        let _ = kernel_cache::store(&p, &img);
    }
    Ok(img)
}
