//! What the MTP drafter adds to the kernels: F32 weights in the products (the MTP file's HC and router
//! matrices are F32), a matrix stacked over the HC streams (`ResidentTensor::stacked`: h_proj on every
//! stream in one grouped product) and the RMS norm of several rows per token. Each against an f64 CPU
//! product / the CPU norm on the test adapter; the F32 modules validate with naga and translate to MSL
//! (they are not in `all_modules`, see `shaders::MATVEC_F32`).
mod common;

use ds4_quant::GgmlType;
use ds4_wgpu::ops::{RmsNorm, StepMatVec};
use ds4_wgpu::shaders::{matvec_shape, matvec_source, F16Unpack, MatVecShape, BATCH_TILE, MATVEC_F32};
use ds4_wgpu::{GpuBuffer, ResidentTensor, Step};

fn bytes_of(w: &[f32]) -> Vec<u8> { w.iter().flat_map(|v| v.to_le_bytes()).collect() }

/// Largest |got - want| over 1e-5 x (sum |w x| of the row + 1e-6): the mat-vec tests' bound.
fn product_err(got: &[f32], want: &[f64], scale: &[f64]) -> f64 {
    got.iter().zip(want).zip(scale).map(|((&g, &w), &s)| (g as f64 - w).abs() / (1e-5 * s + 1e-6)).fold(0.0, common::worse)
}

/// y[t][r] = W[r] . x[t] in f64, and sum |W[r] x[t]| (the bound's scale).
fn reference(w: &[f32], rows: usize, cols: usize, x: &[f32], ntok: usize) -> (Vec<f64>, Vec<f64>) {
    let (mut y, mut s) = (vec![0f64; ntok * rows], vec![0f64; ntok * rows]);
    for t in 0..ntok {
        for r in 0..rows {
            for c in 0..cols {
                let p = w[r * cols + c] as f64 * x[t * cols + c] as f64;
                y[t * rows + r] += p;
                s[t * rows + r] += p.abs();
            }
        }
    }
    (y, s)
}

#[test]
fn f32_products_match_cpu() {
    let Some(gpu) = common::gpu(common::opts(false, Some(20 << 10))) else { return };
    // 40 rows of 264 columns: split over several bindings of 20 KiB.
    let (rows, cols) = (40, 264);
    let w = common::normals(1, rows * cols);
    let t = ResidentTensor::upload(&gpu, "w", MATVEC_F32, &bytes_of(&w), rows, cols).unwrap();
    assert!(t.parts.len() > 1);
    for ntok in [1usize, 5, 20] {
        let x = common::normals(2 + ntok as u64, ntok * cols);
        // Buffers of the op's 32 rows; the step's rows written, the output's NaN until written.
        let xb = GpuBuffer::new(&gpu, "x", 32 * cols).unwrap();
        xb.write(&gpu, &x).unwrap();
        let yb = GpuBuffer::from_slice(&gpu, "y", &vec![f32::NAN; 32 * rows]).unwrap();
        let op = StepMatVec::new(&gpu, &t, &xb, &yb, 32).unwrap();
        gpu.run(Step { ntok: ntok as u32, pos: 0 }, |e| op.encode(e)).unwrap();
        let (want, scale) = reference(&w, rows, cols, &x, ntok);
        let err = product_err(&yb.read(&gpu, ntok * rows).unwrap(), &want, &scale);
        eprintln!("F32 product, {ntok} tokens: {err:.4} of the bound");
        assert!(err <= 1.0, "F32 product of {ntok} tokens off by {err} x the bound");
    }
}

#[test]
fn stacked_matrix_applies_to_every_slice() {
    let Some(gpu) = common::gpu(common::opts(false, Some(20 << 10))) else { return };
    // h_proj-like: e x e (Q8_0 and F32) on 4 slices of e per token, as a grouped product.
    let (e, nh) = (256, 4);
    for ty in [GgmlType::Q8_0, MATVEC_F32] {
        let w = common::normals(3, e * e);
        let bytes = if ty == MATVEC_F32 { bytes_of(&w) } else { ds4_quant::quantize(GgmlType::Q8_0, &w).unwrap() };
        let mut deq = vec![0f32; e * e];
        ds4_quant::dequantize(ty, &bytes, &mut deq).unwrap();
        let t = ResidentTensor::upload(&gpu, "h_proj", ty, &bytes, e, e).unwrap();
        let stacked = t.stacked(nh);
        for ntok in [1usize, 3, 20] {
            let x = common::normals(4 + ntok as u64, ntok * nh * e);
            let xb = GpuBuffer::new(&gpu, "x", 32 * nh * e).unwrap();
            xb.write(&gpu, &x).unwrap();
            let yb = GpuBuffer::from_slice(&gpu, "y", &vec![f32::NAN; 32 * nh * e]).unwrap();
            let op = StepMatVec::grouped(&gpu, &stacked, &xb, &yb, 32, e, nh * e).unwrap();
            gpu.run(Step { ntok: ntok as u32, pos: 0 }, |enc| op.encode(enc)).unwrap();
            // Row (t, s) of the output is the matrix times slice s of token t's row.
            let (want, scale) = reference(&deq, e, e, &x, ntok * nh);
            let err = product_err(&yb.read(&gpu, ntok * nh * e).unwrap(), &want, &scale);
            eprintln!("{} stacked x{nh}, {ntok} tokens: {err:.4} of the bound", ty.name());
            assert!(err <= 1.0, "{} stacked product of {ntok} tokens off by {err} x the bound", ty.name());
        }
    }
}

#[test]
fn rms_norm_of_several_rows_per_token_matches_cpu() {
    let Some(gpu) = common::gpu(common::opts(false, None)) else { return };
    let (n, per, ntok) = (256, 4, 3);
    let x: Vec<f32> = common::normals(5, n * per * ntok).iter().map(|v| v * 3.0).collect();
    let g: Vec<f32> = common::normals(6, n).iter().map(|v| 1.0 + 0.1 * v).collect();
    let xb = GpuBuffer::from_slice(&gpu, "x", &vec![f32::NAN; n * per * 4]).unwrap();
    xb.write(&gpu, &x).unwrap();
    let gb = GpuBuffer::from_slice(&gpu, "g", &g).unwrap();
    let op = RmsNorm::per_token(&gpu, &xb, n, per, Some(&gb), 1e-6, 4).unwrap();
    gpu.run(Step { ntok: ntok as u32, pos: 0 }, |e| op.encode(e)).unwrap();
    let got = xb.read(&gpu, n * per * 4).unwrap();
    let mut want = x.clone();
    for row in want.chunks_mut(n) {
        ds4_model::ops::rms_norm(row, Some(&g[..]), 1e-6);
    }
    // As ops_misc's rms norm: 4e-6 relative allowed.
    let worst = got[..want.len()].iter().zip(&want).map(|(a, b)| ((a - b).abs() / (4e-6 * b.abs() + 1e-7)) as f64).fold(0.0, common::worse);
    eprintln!("rms norm, {per} rows a token: {worst:.3} of the bound");
    assert!(worst <= 1.0, "rms norm of {per} rows a token off by {worst} x the bound");
    // Rows past the step's are left alone.
    assert!(got[want.len()..].iter().all(|v| v.is_nan()), "the norm wrote rows past the step's");
}

#[test]
fn f32_modules_validate_and_translate_to_msl() {
    use naga::back::msl;
    use naga::valid::{Capabilities, ValidationFlags, Validator};
    let shapes = [matvec_shape(MATVEC_F32, 24, 16384), matvec_shape(MATVEC_F32, 256, 4096), MatVecShape { seg: 8, rows_per_thread: 1 }];
    for shape in shapes {
        for tb in [1, BATCH_TILE] {
            for f16 in [F16Unpack::Native, F16Unpack::Bits] {
                let src = matvec_source(MATVEC_F32, tb, if tb == 1 { shape } else { MatVecShape { rows_per_thread: 1, ..shape } }, f16).expect("an F32 module");
                let module = naga::front::wgsl::parse_str(&src).unwrap_or_else(|e| panic!("F32 {shape:?} tb {tb}: {}", e.emit_to_string(&src)));
                let mut caps = Capabilities::empty();
                caps.set(Capabilities::SHADER_FLOAT16_IN_FLOAT32, f16 == F16Unpack::Native);
                let info = Validator::new(ValidationFlags::all(), caps).validate(&module).unwrap_or_else(|e| panic!("F32 {shape:?} tb {tb}: {}", e.emit_to_string(&src)));
                let (text, _) = msl::write_string(&module, &info, &msl::Options { lang_version: (2, 4), fake_missing_bindings: true, ..Default::default() }, &msl::PipelineOptions::default()).unwrap();
                assert!(text.contains("kernel void"));
            }
        }
    }
    // The tiled product's module (prefill steps of 16+ tokens).
    assert!(ds4_wgpu::shaders::matmul_source(MATVEC_F32, F16Unpack::Bits).is_some());
}
