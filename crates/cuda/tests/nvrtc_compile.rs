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

#[test]
fn all_kernels_compile_for_sm_90a() {
    if std::env::var("DS4_CUDA_LIB").is_err() {
        if let Some(d) = venv_nvrtc_dir() {
            std::env::set_var("DS4_CUDA_LIB", d);
        }
    }
    if !ds4_cuda::gpu::nvrtc_present() {
        eprintln!("SKIPPED: libnvrtc.so.13 not found (pip install nvidia-cuda-nvrtc==13.0.* into .venv-cuda, or set DS4_CUDA_LIB)");
        return;
    }
    let t0 = std::time::Instant::now();
    let cubin = ds4_cuda::gpu::compile_cubin(ds4_cuda::KERNELS_CU, "sm_90a").unwrap_or_else(|e| panic!("{e}"));
    assert!(cubin.len() > 1000);
    // Every kernel the backend looks up is present in the image.
    let text = String::from_utf8_lossy(&cubin);
    for k in ds4_cuda::KERNEL_NAMES {
        assert!(text.contains(k), "kernel {k} missing from the CUBIN");
    }
    eprintln!("compiled {} kernels for sm_90a: {} bytes in {:.2} s", ds4_cuda::KERNEL_NAMES.len(), cubin.len(), t0.elapsed().as_secs_f64());
    // The engine compiles for the device it finds: Ampere too (the Hopper-only instructions are
    // behind __CUDA_ARCH__ checks, which must leave valid code when they drop out).
    let t1 = std::time::Instant::now();
    let cubin = ds4_cuda::gpu::compile_cubin(ds4_cuda::KERNELS_CU, "sm_80").unwrap_or_else(|e| panic!("{e}"));
    let text = String::from_utf8_lossy(&cubin);
    for k in ds4_cuda::KERNEL_NAMES {
        assert!(text.contains(k), "kernel {k} missing from the sm_80 CUBIN");
    }
    eprintln!("compiled for sm_80 in {:.2} s", t1.elapsed().as_secs_f64());
}
