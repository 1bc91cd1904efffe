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

/// Each module compiles on its own and defines exactly the kernels it lists (names are what the
/// launchers look up); no kernel is listed twice.
fn check_modules(arch: &str) {
    let mods: Vec<&ds4_cuda::KernelModule> = ds4_cuda::MODULES.iter().collect();
    let t0 = std::time::Instant::now();
    let images = ds4_cuda::nvrtc::compile_modules(&mods, arch, ds4_cuda::nvrtc::compile_threads()).unwrap_or_else(|e| panic!("{e}"));
    let mut seen = std::collections::HashSet::new();
    for (m, img) in ds4_cuda::MODULES.iter().zip(&images) {
        assert!(img.len() > 1000, "module {} for {arch}: {} bytes", m.name, img.len());
        let text = String::from_utf8_lossy(img);
        for k in m.kernels {
            assert!(seen.insert(*k), "kernel {k} listed twice");
            assert!(text.contains(k), "kernel {k} missing from module {} for {arch}", m.name);
        }
    }
    let n: usize = images.iter().map(|i| i.len()).sum();
    eprintln!("compiled {} modules ({} kernels) for {arch}: {n} bytes in {:.2} s on {} threads", images.len(), seen.len(), t0.elapsed().as_secs_f64(), ds4_cuda::nvrtc::compile_threads());
}

#[test]
fn all_kernels_compile_for_sm_90a() {
    if nvrtc_or_skip() {
        check_modules("sm_90a");
    }
}

/// The engine compiles for the device it finds: Ampere too (the Hopper-only instructions are behind
/// __CUDA_ARCH__ checks, which must leave valid code when they drop out).
#[test]
fn all_kernels_compile_for_sm_80() {
    if nvrtc_or_skip() {
        check_modules("sm_80");
    }
}
