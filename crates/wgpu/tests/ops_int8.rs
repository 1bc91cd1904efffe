//! Q8_0 products against int8 activations (`QuantizeQ8` + `MatVecI8`, the CPU's Precision::Fast on
//! the GPU) on the test adapter:
//! - the quantized activation rows equal `ds4_quant::quantize_row_q8_0`'s bytes and f16 scales
//!   exactly (rows with a zero block, tiny and large blocks, values at rounding ties);
//! - the products against an f64 reference built from those bytes (each block's exact integer
//!   dot times d_w * d_x), bound 2e-7 of sum |terms| per output (measured 3.4e-8 on lavapipe), and against
//!   the library's own Fast path; with a forced small binding limit (the matrix in several parts).
mod common;

use ds4_quant::{GgmlType, MatRef, Precision};
use ds4_wgpu::ops::{MatVecI8, QuantizeQ8};
use ds4_wgpu::{GpuBuffer, ResidentTensor, Step};

const ROWS: usize = 70;
const COLS: usize = 32 * 33;

/// Activation rows: normals, with block 0 of row 1 zero, block 1 tiny, block 2 large, and block 3
/// of row 0 holding exact half-way points of its quantization grid.
fn activations(ntok: usize) -> Vec<f32> {
    let mut x = common::normals(11, ntok * COLS);
    if ntok > 1 {
        x[COLS..COLS + 32].fill(0.0);
        x[COLS + 32..COLS + 64].iter_mut().for_each(|v| *v *= 1e-30);
        x[COLS + 64..COLS + 96].iter_mut().for_each(|v| *v *= 1e4);
    }
    // amax 127 gives d = 1 and 1 / d = 1: values k + 0.5 are ties (round half away from zero).
    for (i, v) in x[96..128].iter_mut().enumerate() {
        *v = if i == 0 { 127.0 } else { (i as f32 - 16.0) + 0.5 };
    }
    x
}

fn cpu_q8(x: &[f32]) -> Vec<u8> {
    let mut out = vec![0u8; x.len() / 32 * 34];
    ds4_quant::quantize_row_q8_0(x, &mut out);
    out
}

#[test]
fn quantize_equals_cpu_bytes() {
    let Some(gpu) = common::gpu(common::opts(false, None)) else { return };
    let ntok = 3;
    let x = activations(ntok);
    let xb = GpuBuffer::from_slice(&gpu, "x", &x).unwrap();
    let (xq, xd) = (GpuBuffer::new(&gpu, "xq", ntok * COLS / 4).unwrap(), GpuBuffer::new(&gpu, "xd", ntok * COLS / 32).unwrap());
    let q = QuantizeQ8::new(&gpu, &xb, COLS, &xq, &xd, COLS, 3).unwrap();
    gpu.run(Step { ntok: ntok as u32, pos: 0 }, |e| q.encode(e)).unwrap();
    let (gq, gd) = (xq.read(&gpu, ntok * COLS / 4).unwrap(), xd.read(&gpu, ntok * COLS / 32).unwrap());
    let want = cpu_q8(&x);
    let (mut bad_q, mut bad_d) = (0, 0);
    for (b, blk) in want.chunks_exact(34).enumerate() {
        let d = half::f16::from_le_bytes([blk[0], blk[1]]).to_f32();
        if gd[b].to_bits() != d.to_bits() {
            bad_d += 1;
        }
        for k in 0..8 {
            let w = u32::from_le_bytes([blk[2 + 4 * k], blk[3 + 4 * k], blk[4 + 4 * k], blk[5 + 4 * k]]);
            if gq[b * 8 + k].to_bits() != w {
                bad_q += 1;
            }
        }
    }
    assert_eq!((bad_q, bad_d), (0, 0), "quantized words / scales that differ from the CPU's");
    // The tie block: +/-(k + 0.5) rounds away from zero.
    // Value 1 of the block is -14.5: -15 (away from zero), not -14 (to even).
    assert_eq!(want[3 * 34 + 2 + 1] as i8, -15, "CPU tie rounding");
}

fn f64_reference(w: &[u8], xq: &[u8], rows: usize, cols: usize) -> (Vec<f64>, Vec<f64>) {
    let nb = cols / 32;
    let (mut y, mut mag) = (vec![0f64; rows], vec![0f64; rows]);
    for r in 0..rows {
        for b in 0..nb {
            let wb = &w[(r * nb + b) * 34..(r * nb + b + 1) * 34];
            let xbk = &xq[b * 34..(b + 1) * 34];
            let dw = half::f16::from_le_bytes([wb[0], wb[1]]).to_f64();
            let dx = half::f16::from_le_bytes([xbk[0], xbk[1]]).to_f64();
            let s: i64 = (0..32).map(|i| wb[2 + i] as i8 as i64 * xbk[2 + i] as i8 as i64).sum();
            let sa: i64 = (0..32).map(|i| (wb[2 + i] as i8 as i64 * xbk[2 + i] as i8 as i64).abs()).sum();
            y[r] += dw * dx * s as f64;
            mag[r] += (dw * dx).abs() * sa as f64;
        }
    }
    (y, mag)
}

#[test]
fn int8_matvec_matches_cpu_fast_path() {
    let row_bytes = GgmlType::Q8_0.row_bytes(COLS).unwrap() as u64;
    // 16 rows a binding: 70 rows in 5 parts.
    let Some(gpu) = common::gpu(common::opts(false, Some(row_bytes * 16 + 4))) else { return };
    let w = ds4_quant::random_valid_blocks(GgmlType::Q8_0, 5, ROWS * COLS / 32);
    let t = ResidentTensor::upload(&gpu, "w", GgmlType::Q8_0, &w, ROWS, COLS).unwrap();
    assert!(t.parts.len() > 1);
    let x = activations(2);
    let xb = GpuBuffer::from_slice(&gpu, "x", &x).unwrap();
    let (xq, xd, y) = (GpuBuffer::new(&gpu, "xq", 2 * COLS / 4).unwrap(), GpuBuffer::new(&gpu, "xd", 2 * COLS / 32).unwrap(), GpuBuffer::new(&gpu, "y", ROWS).unwrap());
    let q = QuantizeQ8::new(&gpu, &xb, COLS, &xq, &xd, COLS, 2).unwrap();
    let mv = MatVecI8::new(&gpu, &t, &xq, &xd, &y).unwrap();
    gpu.run(Step { ntok: 1, pos: 0 }, |e| {
        q.encode(e)?;
        mv.encode(e)
    })
    .unwrap();
    let got = y.read(&gpu, ROWS).unwrap();
    let (want, mag) = f64_reference(&w, &cpu_q8(&x[..COLS]), ROWS, COLS);
    let mut lib = vec![0f32; ROWS];
    ds4_quant::matvec(&MatRef::new(GgmlType::Q8_0, &w, ROWS, COLS).unwrap(), &x[..COLS], &mut lib, Precision::Fast);
    let mut exact = vec![0f32; ROWS];
    ds4_quant::matvec(&MatRef::new(GgmlType::Q8_0, &w, ROWS, COLS).unwrap(), &x[..COLS], &mut exact, Precision::Exact);
    let (mut worst, mut worst_lib, mut f32_path) = (0f64, 0f64, 0f64);
    for r in 0..ROWS {
        let bound = 2e-7 * mag[r];
        worst = common::worse(worst, (got[r] as f64 - want[r]).abs() / bound);
        worst_lib = common::worse(worst_lib, (lib[r] as f64 - want[r]).abs() / bound);
        // What a product on the f32 activations (no quantization) would be off by.
        f32_path = common::worse(f32_path, (exact[r] as f64 - want[r]).abs() / bound);
    }
    eprintln!("int8 mat-vec: {worst:.4} of the bound (library Fast path {worst_lib:.4}; the f32-activation product {f32_path:.1})");
    assert!(worst_lib <= 1.0, "the library's Fast path disagrees with the reference");
    assert!(worst <= 1.0, "int8 mat-vec off the reference: {worst} x the bound");
    assert!(f32_path > 10.0, "the bound does not tell the quantized product from the f32 one ({f32_path})");
    // One token only.
    assert!(gpu.run(Step { ntok: 2, pos: 0 }, |e| mv.encode(e)).is_err());
}
