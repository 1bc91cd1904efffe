//! Compiles every kernel with NVRTC for sm_90a when libnvrtc is available (no GPU needed), so CI and
//! machines without a GPU still check the CUDA source. Skips with a message when NVRTC is absent.
#![cfg(feature = "cuda")]

fn venv_nvrtc_dir() -> Option<String> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    for venv in [".venv-cuda", ".venv-ci"] {
        let lib = root.join(venv).join("lib");
        let Ok(rd) = std::fs::read_dir(&lib) else { continue };
        for py in rd.flatten() {
            let d = py.path().join("site-packages/nvidia/cu13/lib");
            if d.join("libnvrtc.so.13").exists() {
                return Some(d.to_string_lossy().into_owned());
            }
        }
    }
    None
}

fn nvrtc_or_skip() -> bool {
    if std::env::var("DS4_CUDA_LIB").is_err() {
        if let Some(d) = venv_nvrtc_dir() {
            std::env::set_var("DS4_CUDA_LIB", d);
        }
    }
    if !ds4_cuda::nvrtc::nvrtc_present() {
        eprintln!("SKIPPED: libnvrtc.so.13 not found (pip install nvidia-cuda-nvrtc==13.0.* into .venv-cuda, or set DS4_CUDA_LIB)");
        return false;
    }
    true
}

/// Each module defines exactly the kernels it lists (names are what the launchers look up); no
/// kernel is listed twice.
fn check_images(arch: &str, images: &[Vec<u8>]) {
    let mut seen = std::collections::HashSet::new();
    for (m, img) in ds4_cuda::MODULES.iter().zip(images) {
        assert!(img.len() > 1000, "module {} for {arch}: {} bytes", m.name, img.len());
        let text = String::from_utf8_lossy(img);
        for k in m.kernels {
            assert!(seen.insert(*k), "kernel {k} listed twice");
            assert!(text.contains(k), "kernel {k} missing from module {} for {arch}", m.name);
        }
    }
}

/// Every module compiles for the H200 (sm_90a), through the start-up path: an empty cache directory
/// is filled, a second start reads every module from it (same bytes), and a damaged entry is
/// compiled again and rewritten, not loaded.
#[test]
fn all_kernels_compile_for_sm_90a() {
    if !nvrtc_or_skip() {
        return;
    }
    let arch = "sm_90a";
    let dir = std::env::temp_dir().join(format!("ds4-nvrtc-cache-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    // The only test here that reads the cache location.
    std::env::set_var("DS4_CUDA_CACHE", &dir);
    ds4_cuda::nvrtc::check_arch(arch).unwrap();
    let t0 = std::time::Instant::now();
    let cold = ds4_cuda::nvrtc::module_images(arch).unwrap_or_else(|e| panic!("{e}"));
    eprintln!("cold cache: {} modules for {arch} in {:.2} s on {} threads", cold.images.len(), t0.elapsed().as_secs_f64(), ds4_cuda::nvrtc::compile_threads());
    assert!(cold.cached.iter().all(|c| !c), "empty cache directory");
    check_images(arch, &cold.images);
    let t1 = std::time::Instant::now();
    let warm = ds4_cuda::nvrtc::module_images(arch).unwrap();
    eprintln!("warm cache: {:.3} s", t1.elapsed().as_secs_f64());
    assert!(warm.cached.iter().all(|&c| c), "every module from the cache");
    assert_eq!(warm.images, cold.images);
    // Damage the entry of one module: it is compiled again, the others still come from the cache.
    let version = ds4_cuda::nvrtc::nvrtc_version().unwrap();
    let k = ds4_cuda::MODULES.iter().position(|m| m.name == "argmax").unwrap();
    let path = ds4_cuda::nvrtc::entry_path(&ds4_cuda::MODULES[k], arch, &version).unwrap();
    let bytes = std::fs::read(&path).unwrap();
    std::fs::write(&path, &bytes[..bytes.len() / 2]).unwrap();
    let again = ds4_cuda::nvrtc::module_images(arch).unwrap();
    let fresh: Vec<usize> = (0..again.cached.len()).filter(|&i| !again.cached[i]).collect();
    assert_eq!(fresh, vec![k], "only the damaged module is compiled again");
    assert_eq!(again.images, cold.images);
    assert_eq!(std::fs::read(&path).unwrap(), bytes, "the entry is rewritten whole");
    let _ = std::fs::remove_dir_all(&dir);
}

/// An architecture NVRTC does not know is refused before anything is compiled, naming the fix.
#[test]
fn unknown_architecture_is_refused() {
    if !nvrtc_or_skip() {
        return;
    }
    let err = ds4_cuda::nvrtc::check_arch("sm_10").unwrap_err();
    assert!(err.contains("DS4_CUDA_LIB") && err.contains("sm_10"), "{err}");
    assert!(ds4_cuda::nvrtc::check_arch("sm_80").is_ok());
}

/// The engine compiles for the device it finds: Ampere too (the Hopper-only instructions are behind
/// __CUDA_ARCH__ checks, which must leave valid code when they drop out).
#[test]
fn all_kernels_compile_for_sm_80() {
    if nvrtc_or_skip() {
        let mods: Vec<&ds4_cuda::KernelModule> = ds4_cuda::MODULES.iter().collect();
        let images = ds4_cuda::nvrtc::compile_modules(&mods, "sm_80", ds4_cuda::nvrtc::compile_threads()).unwrap_or_else(|e| panic!("{e}"));
        check_images("sm_80", &images);
    }
}

/// DGX Spark (GB10, compute capability 12.1), where seed reports' users run: every module compiles for
/// it (the kernels use no Hopper-only instructions; programmatic dependent launch stays on past Hopper).
#[test]
fn all_kernels_compile_for_sm_121() {
    if nvrtc_or_skip() {
        ds4_cuda::nvrtc::check_arch("sm_121").unwrap();
        let mods: Vec<&ds4_cuda::KernelModule> = ds4_cuda::MODULES.iter().collect();
        let images = ds4_cuda::nvrtc::compile_modules(&mods, "sm_121", ds4_cuda::nvrtc::compile_threads()).unwrap_or_else(|e| panic!("{e}"));
        check_images("sm_121", &images);
    }
}

/// Process CPU seconds (user + system) from /proc/self/stat (Linux).
fn cpu_s() -> f64 {
    let s = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let f: Vec<&str> = s.rsplit(')').next().unwrap_or("").split_whitespace().collect();
    let tick = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    (tick(11) + tick(12)) / 100.0
}

/// Compile times for the cold-start budget: every module alone (serial), all of them on one thread
/// and on one per core, and the same sources as one program. `DS4_ARCH` (default sm_90a).
/// cargo test --release -p ds4-cuda --features cuda --test nvrtc_compile compile_times -- --ignored --nocapture
#[test]
#[ignore]
fn compile_times() {
    if !nvrtc_or_skip() {
        return;
    }
    let arch = std::env::var("DS4_ARCH").unwrap_or_else(|_| "sm_90a".into());
    let mods: Vec<&ds4_cuda::KernelModule> = ds4_cuda::MODULES.iter().collect();
    let mut per = Vec::new();
    for m in &mods {
        let (t, c) = (std::time::Instant::now(), cpu_s());
        ds4_cuda::nvrtc::compile_modules(&[m], &arch, 1).unwrap_or_else(|e| panic!("{e}"));
        per.push((m.name, t.elapsed().as_secs_f64(), cpu_s() - c));
    }
    per.sort_by(|a, b| b.1.total_cmp(&a.1));
    for (n, w, c) in &per {
        eprintln!("module {n:<18} {w:>6.2} s wall {c:>6.2} s cpu");
    }
    eprintln!("sum of modules: {:.2} s wall, {:.2} s cpu", per.iter().map(|p| p.1).sum::<f64>(), per.iter().map(|p| p.2).sum::<f64>());
    for threads in [1, ds4_cuda::nvrtc::compile_threads()] {
        let (t, c) = (std::time::Instant::now(), cpu_s());
        ds4_cuda::nvrtc::compile_modules(&mods, &arch, threads).unwrap_or_else(|e| panic!("{e}"));
        eprintln!("all modules on {threads} thread(s): {:.2} s wall, {:.2} s cpu", t.elapsed().as_secs_f64(), cpu_s() - c);
    }
    // A single program for comparison (e.g. the sources before the split into modules).
    if let Ok(path) = std::env::var("DS4_ONE_PROGRAM") {
        let src = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
        let (t, c) = (std::time::Instant::now(), cpu_s());
        ds4_cuda::nvrtc::compile_cubin(&src, &arch).unwrap_or_else(|e| panic!("{e}"));
        eprintln!("one program {path}: {:.2} s wall, {:.2} s cpu", t.elapsed().as_secs_f64(), cpu_s() - c);
    }
}

/// Compiles the modules named in `DS4_MODULES` (comma-separated) on `DS4_THREADS` threads and prints
/// wall and CPU seconds: run it as two processes at once against one process with two threads to
/// tell whether NVRTC compiles in parallel within a process.
#[test]
#[ignore]
fn compile_named_modules() {
    if !nvrtc_or_skip() {
        return;
    }
    let names = std::env::var("DS4_MODULES").unwrap_or_default();
    let threads: usize = std::env::var("DS4_THREADS").ok().and_then(|v| v.parse().ok()).unwrap_or(1);
    let mods: Vec<&ds4_cuda::KernelModule> = names.split(',').filter_map(|n| ds4_cuda::MODULES.iter().find(|m| m.name == n)).collect();
    let (t, c) = (std::time::Instant::now(), cpu_s());
    ds4_cuda::nvrtc::compile_modules(&mods, "sm_90a", threads).unwrap_or_else(|e| panic!("{e}"));
    eprintln!("{names} on {threads} thread(s): {:.2} s wall, {:.2} s cpu", t.elapsed().as_secs_f64(), cpu_s() - c);
}
