//! Zero-copy weights: tensors inside a read-only, file-backed mmap (at 32-byte, not page, aligned
//! offsets, like GGUF data) imported as device memory through VK_EXT_external_memory_host on
//! lavapipe, split at a small binding, and used by the mat-vec kernels: same results as the CPU
//! reference, no upload counted. With import switched off the same call uploads.
mod common;

use std::io::Write;
use std::sync::Arc;

use ds4_quant::GgmlType;
use ds4_wgpu::ops::{MatVec, Product};
use ds4_wgpu::{GpuBuffer, GpuOptions, ResidentTensor, Step};

const ROWS: usize = 70;

fn write_file(tag: &str, tensors: &[(usize, &[u8])]) -> (std::path::PathBuf, Arc<memmap2::Mmap>) {
    // One file per test (tests run in parallel threads of one process).
    let path = std::env::temp_dir().join(format!("ds4-wgpu-import-{}-{tag}.bin", std::process::id()));
    let end = tensors.iter().map(|(o, b)| o + b.len()).max().unwrap_or(0);
    let mut bytes = vec![0xA5u8; end + 100];
    for (o, b) in tensors {
        bytes[*o..o + b.len()].copy_from_slice(b);
    }
    std::fs::File::create(&path).unwrap().write_all(&bytes).unwrap();
    let f = std::fs::File::open(&path).unwrap();
    // SAFETY: the file is private to this test and not modified while mapped.
    let map = unsafe { memmap2::Mmap::map(&f) }.unwrap();
    (path, Arc::new(map))
}

fn check(gpu: &ds4_wgpu::Gpu, t: &ResidentTensor, w: &[u8]) {
    let x = common::normals(9, t.cols);
    let xb = GpuBuffer::from_slice(gpu, "x", &x).unwrap();
    let yb = GpuBuffer::new(gpu, "y", t.rows).unwrap();
    let op = MatVec::new(gpu, t, &xb, &yb, Product::Vec).unwrap();
    gpu.run(Step { ntok: 1, pos: 0 }, |e| op.encode(e)).unwrap();
    let y = yb.read(gpu, t.rows).unwrap();
    let mut deq = vec![0f32; t.rows * t.cols];
    ds4_quant::dequantize(t.ty, w, &mut deq).unwrap();
    for (r, row) in deq.chunks(t.cols).enumerate() {
        let want: f64 = row.iter().zip(&x).map(|(&a, &b)| a as f64 * b as f64).sum();
        let mag: f64 = row.iter().zip(&x).map(|(&a, &b)| (a as f64 * b as f64).abs()).sum();
        assert!((y[r] as f64 - want).abs() <= 1e-5 * mag, "{} row {r}: {} vs {want}", t.name, y[r]);
    }
}

#[test]
fn mmapped_tensors_are_imported_without_a_copy() {
    let Some(gpu) = common::gpu(GpuOptions { max_binding_bytes: Some(3 * 4096), ..Default::default() }) else { return };
    let Some(align) = gpu.caps().host_import_alignment else {
        panic!("adapter {} cannot import host memory (VK_EXT_external_memory_host): lavapipe can", gpu.caps().adapter)
    };
    eprintln!("import alignment {align}");
    let q4 = ds4_quant::random_valid_blocks(GgmlType::Q4_K, 1, ROWS * 3);
    let q8 = ds4_quant::random_valid_blocks(GgmlType::Q8_0, 2, ROWS * 9);
    let (o4, o8) = (4096 + 96, 4096 * 20 + 32);
    let (path, map) = write_file("import", &[(o4, &q4), (o8, &q8)]);
    let before = gpu.counters();
    let t4 = ResidentTensor::from_mapping(&gpu, "q4", GgmlType::Q4_K, map.clone(), o4, ROWS, 768).unwrap();
    let t8 = ResidentTensor::from_mapping(&gpu, "q8", GgmlType::Q8_0, map.clone(), o8, ROWS, 288).unwrap();
    let after = gpu.counters();
    assert!(t4.parts.len() > 1 && t8.parts.len() > 1, "tensors should be split at a 12 KiB binding");
    assert!(t4.parts.iter().chain(&t8.parts).all(|p| p.imported));
    assert!(t8.parts.iter().any(|p| p.byte_offset % 4 == 2), "some Q8_0 part should start at a 2-mod-4 byte");
    assert_eq!(after.weight_uploads, before.weight_uploads, "nothing may be uploaded");
    assert_eq!(after.weight_imports - before.weight_imports, (t4.parts.len() + t8.parts.len()) as u64);
    check(&gpu, &t4, &q4);
    check(&gpu, &t8, &q8);
    drop((t4, t8));
    drop(gpu);
    let _ = std::fs::remove_file(path);
}

#[test]
fn without_import_the_mapping_is_uploaded() {
    let Some(gpu) = common::gpu(GpuOptions { no_host_import: true, ..Default::default() }) else { return };
    assert_eq!(gpu.caps().host_import_alignment, None);
    let q2 = ds4_quant::random_valid_blocks(GgmlType::Q2_K, 3, ROWS * 3);
    let o2 = 4096 * 3 + 64;
    let (path, map) = write_file("upload", &[(o2, &q2)]);
    let before = gpu.counters();
    let t = ResidentTensor::from_mapping(&gpu, "q2", GgmlType::Q2_K, map, o2, ROWS, 768).unwrap();
    let after = gpu.counters();
    assert!(t.parts.iter().all(|p| !p.imported));
    assert_eq!((after.weight_uploads - before.weight_uploads, after.weight_imports), (t.parts.len() as u64, before.weight_imports));
    check(&gpu, &t, &q2);
    // A tensor running past the mapping is a shape error.
    let len = std::fs::metadata(&path).unwrap().len() as usize;
    // SAFETY: as in write_file: the file is private to this test and not modified while mapped.
    let map2 = Arc::new(unsafe { memmap2::Mmap::map(&std::fs::File::open(&path).unwrap()) }.unwrap());
    let e = ResidentTensor::from_mapping(&gpu, "late", GgmlType::Q2_K, map2, len - 10, ROWS, 768).err().expect("past the end");
    assert!(matches!(e, ds4_wgpu::WgpuError::BadShape { .. }), "{e:?}");
    let _ = std::fs::remove_file(path);
}
