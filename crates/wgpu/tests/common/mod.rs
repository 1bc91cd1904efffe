//! Opening the test device (lavapipe in CI). No adapter fails the test with the error's message,
//! unless DS4_WGPU_SKIP=1 (local machines without a Vulkan driver).
#![allow(dead_code)]
use ds4_wgpu::{Gpu, GpuOptions};

pub fn skip() -> bool {
    std::env::var("DS4_WGPU_SKIP").is_ok_and(|v| v == "1")
}

/// The device with `opts`, or None when skipping is allowed and no device opens.
pub fn gpu(opts: GpuOptions) -> Option<Gpu> {
    match Gpu::new(&opts) {
        Ok(g) => Some(g),
        Err(e) if skip() => {
            eprintln!("DS4_WGPU_SKIP=1: skipping ({e})");
            None
        }
        Err(e) => panic!("no wgpu device: {e}\n(CI installs lavapipe: apt-get install -y mesa-vulkan-drivers libvulkan1; set DS4_WGPU_SKIP=1 to skip locally)"),
    }
}

/// Full features, or every fallback (no subgroups, integer f16 decode).
pub fn opts(fallback: bool, max_binding: Option<u64>) -> GpuOptions {
    GpuOptions {
        max_binding_bytes: max_binding,
        disable: if fallback { ds4_wgpu::wgpu::Features::SUBGROUP | ds4_wgpu::wgpu::Features::SHADER_F16 } else { ds4_wgpu::wgpu::Features::empty() },
        ..Default::default()
    }
}

/// Deterministic values ~ N(0, 1) (SplitMix64 + Box-Muller from ds4_quant).
pub fn normals(seed: u64, n: usize) -> Vec<f32> {
    let mut r = ds4_quant::random::SplitMix64(seed);
    (0..n).map(|_| r.normal()).collect()
}

/// The larger of two error measures, NaN counting as unbounded: `f64::max` returns the other argument
/// for NaN, so an unwritten output (the tests pre-fill outputs with NaN) or a poisoned one would pass.
pub fn worse(a: f64, b: f64) -> f64 {
    if a.is_nan() || b.is_nan() {
        f64::INFINITY
    } else {
        a.max(b)
    }
}

/// `worse` for f32 error measures.
pub fn worse32(a: f32, b: f32) -> f32 {
    if a.is_nan() || b.is_nan() {
        f32::INFINITY
    } else {
        a.max(b)
    }
}
