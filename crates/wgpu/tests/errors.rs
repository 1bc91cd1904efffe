//! The clear-error cases: no adapter, no Vulkan loader, a binding over the limit, a missing
//! feature, invalid WGSL. Each is a typed error whose message names the fix, never a panic.
//! Cases that need a different Vulkan environment run in a child process of this test binary.
mod common;

use std::process::Command;

use ds4_quant::GgmlType;
use ds4_wgpu::wgpu::Features;
use ds4_wgpu::{library_present, Gpu, GpuBuffer, GpuOptions, ResidentTensor, WgpuError, VULKAN_LOADER};

fn in_child() -> bool {
    std::env::var("DS4_WGPU_ERRORS_CHILD").is_ok()
}

/// Runs the ignored test `name` of this binary with `VK_ICD_FILENAMES=/nonexistent` (no driver).
fn run_child_without_driver(name: &str) {
    let out = Command::new(std::env::current_exe().expect("test binary"))
        .args(["--exact", name, "--ignored", "--nocapture", "--test-threads=1"])
        .env("VK_ICD_FILENAMES", "/nonexistent")
        .env("VK_DRIVER_FILES", "/nonexistent")
        .env("DS4_WGPU_ERRORS_CHILD", "1")
        .output()
        .expect("spawn child");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success() && text.contains("1 passed"), "child {name} failed:\n{text}");
}

#[test]
fn loader_probe() {
    if !library_present(VULKAN_LOADER) && common::skip() {
        return;
    }
    assert!(library_present(VULKAN_LOADER), "{VULKAN_LOADER} not loadable: install libvulkan1");
    assert!(!library_present("libds4-no-such-library.so.7"));
}

#[test]
fn no_driver_is_no_adapter() {
    run_child_without_driver("child_no_adapter");
}

#[test]
#[ignore = "run by no_driver_is_no_adapter in a child process"]
fn child_no_adapter() {
    if !in_child() {
        return; // only meaningful under the parent's environment
    }
    let e = Gpu::new(&GpuOptions::default()).err().expect("no adapter without a driver");
    let msg = e.to_string();
    eprintln!("{msg}");
    assert!(matches!(e, WgpuError::NoAdapter { .. }), "{e:?}");
    assert!(msg.contains("mesa-vulkan-drivers") && msg.contains("--backend cpu"), "{msg}");
}

#[test]
fn no_loader_names_libvulkan1() {
    run_child_without_driver("child_no_loader");
}

#[test]
#[ignore = "run by no_loader_names_libvulkan1 in a child process"]
fn child_no_loader() {
    if !in_child() {
        return;
    }
    // No driver (so no adapter) and a loader name that does not exist: what a machine without
    // libvulkan.so.1 sees.
    let opts = GpuOptions { loader_probe: Some("libds4-no-such-vulkan.so.1".into()), ..Default::default() };
    let e = Gpu::new(&opts).err().expect("no adapter");
    let msg = e.to_string();
    eprintln!("{msg}");
    assert!(matches!(e, WgpuError::VulkanLoaderMissing { .. }), "{e:?}");
    assert!(msg.contains("libvulkan.so.1") && msg.contains("apt-get install libvulkan1 mesa-vulkan-drivers"), "{msg}");
}

#[test]
fn adapter_name_filter_without_match_is_no_adapter() {
    let Some(_) = common::gpu(GpuOptions::default()) else { return };
    let e = Gpu::new(&GpuOptions { adapter_name: Some("no-such-gpu-9000".into()), ..Default::default() }).err().expect("no match");
    assert!(e.to_string().contains("no-such-gpu-9000"), "{e}");
}

#[test]
fn missing_feature_is_named() {
    let Some(_) = common::gpu(GpuOptions::default()) else { return };
    let opts = GpuOptions { disable: Features::SUBGROUP, require: Features::SUBGROUP, ..Default::default() };
    let e = Gpu::new(&opts).err().expect("missing feature");
    assert!(matches!(e, WgpuError::MissingFeature { feature: "SUBGROUP", .. }), "{e:?}");
    assert!(e.to_string().contains("lacks the feature SUBGROUP"), "{e}");
}

#[test]
fn binding_over_limit() {
    // One Q8_0 row of 4096 columns is 4352 bytes; with a 4 KiB weight binding it cannot be placed.
    let Some(gpu) = common::gpu(common::opts(false, Some(4096))) else { return };
    let w = ds4_quant::random_valid_blocks(GgmlType::Q8_0, 1, 2 * 4096 / 32);
    let e = ResidentTensor::upload(&gpu, "blk.0.attn_q", GgmlType::Q8_0, &w, 2, 4096).err().expect("over the limit");
    assert!(matches!(e, WgpuError::BindingOverLimit { bytes: 4356, limit: 4096, .. }), "{e:?}");
    assert!(e.to_string().contains("one row of blk.0.attn_q"), "{e}");
    // An activation buffer over the adapter's own limit is refused before anything is allocated.
    let limit = gpu.caps().max_binding;
    let e = GpuBuffer::new(&gpu, "huge", (limit / 4 + 1) as usize).err().expect("over the limit");
    assert!(matches!(e, WgpuError::BindingOverLimit { .. }), "{e:?}");
    // Zero columns and an absurd buffer length are errors, not panics.
    let e = ResidentTensor::upload(&gpu, "t", GgmlType::F16, &[], 5, 0).err().expect("zero columns");
    assert!(matches!(e, WgpuError::BadShape { .. }), "{e:?}");
    assert!(matches!(GpuBuffer::new(&gpu, "absurd", usize::MAX).err(), Some(WgpuError::BindingOverLimit { .. })));
    // A wrongly sized tensor is a shape error.
    let e = ResidentTensor::upload(&gpu, "t", GgmlType::Q8_0, &w[..100], 2, 4096).err().expect("bad length");
    assert!(matches!(e, WgpuError::BadShape { .. }), "{e:?}");
}

#[test]
fn invalid_wgsl_is_an_error_not_a_panic() {
    let Some(gpu) = common::gpu(GpuOptions::default()) else { return };
    let e = gpu.check_wgsl("bad", "@compute @workgroup_size(1) fn main() { let x: u32 = 1.5; }").err().expect("invalid");
    assert!(matches!(e, WgpuError::Device { .. }), "{e:?}");
    // The device still works afterwards.
    gpu.check_wgsl("good", "@compute @workgroup_size(1) fn main() {}").expect("valid module");
}

#[test]
fn adapter_and_caps_are_reported() {
    let Some(gpu) = common::gpu(GpuOptions::default()) else { return };
    let c = gpu.caps();
    eprintln!("{c:?}");
    assert!(c.max_binding >= 128 << 20, "binding limit {} (adapter limits not requested?)", c.max_binding);
    assert_eq!(c.weight_binding, c.max_binding);
}
