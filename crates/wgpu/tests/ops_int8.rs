//! Q8_0 products against int8 activations (`QuantizeQ8` + `MatVecI8`, the CPU's Precision::Fast on
//! the GPU) on the test adapter:
//! - the quantized activation rows equal `ds4_quant::quantize_row_q8_0`'s bytes and f16 scales
//!   exactly (rows with a zero block, tiny and large blocks, values at rounding ties);
//! - the products against an f64 reference built from those bytes (each block's exact integer
//!   dot times d_w * d_x), bound 2e-7 of sum |terms| per output (measured 3.4e-8 on lavapipe), and against
//!   the library's own Fast path; with a forced small binding limit (the matrix in several parts).
mod common;

use ds4_quant::{GgmlType, MatRef, Precision};
use ds4_wgpu::ops::{ActBlocks, ExpertMatVecI8, MatVecI8, QuantizeQ8};
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
    let q = QuantizeQ8::new(&gpu, ActBlocks::Q8_0, &xb, COLS, &xq, &xd, COLS, 3).unwrap();
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
    let q = QuantizeQ8::new(&gpu, ActBlocks::Q8_0, &xb, COLS, &xq, &xd, COLS, 2).unwrap();
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

const K_COLS: usize = 256 * 5;

/// Q8_K activation rows: normals, with block 1 zero, block 2 tiny, block 3 large, and in block 4 two
/// values of the largest magnitude with opposite signs (the first, -3, must set the scale).
fn k_activations() -> Vec<f32> {
    let mut x = common::normals(21, K_COLS);
    x[256..512].fill(0.0);
    x[512..768].iter_mut().for_each(|v| *v *= 1e-30);
    x[768..1024].iter_mut().for_each(|v| *v *= 1e4);
    x[1024..1280].iter_mut().for_each(|v| *v = v.clamp(-2.5, 2.5));
    x[1034] = -3.0;
    x[1200] = 3.0;
    x
}

fn cpu_q8k(x: &[f32]) -> Vec<u8> {
    let bytes = GgmlType::Q8_K.row_bytes(x.len()).unwrap();
    let mut out = vec![0u8; bytes];
    ds4_quant::quantize_row_q8_k(x, &mut out);
    out
}

#[test]
fn quantize_q8_k_equals_cpu_bytes() {
    let Some(gpu) = common::gpu(common::opts(false, None)) else { return };
    let x = k_activations();
    let xb = GpuBuffer::from_slice(&gpu, "x", &x).unwrap();
    let (xq, xd) = (GpuBuffer::new(&gpu, "xq", K_COLS / 4).unwrap(), GpuBuffer::new(&gpu, "xd", K_COLS / 256).unwrap());
    let q = QuantizeQ8::new(&gpu, ActBlocks::Q8_K, &xb, K_COLS, &xq, &xd, K_COLS, 1).unwrap();
    gpu.run(Step { ntok: 1, pos: 0 }, |e| q.encode(e)).unwrap();
    let (gq, gd) = (xq.read(&gpu, K_COLS / 4).unwrap(), xd.read(&gpu, K_COLS / 256).unwrap());
    let want = cpu_q8k(&x);
    let bb = want.len() / (K_COLS / 256);
    let (mut bad_q, mut bad_d) = (0, 0);
    for (b, blk) in want.chunks_exact(bb).enumerate() {
        // d within one ulp: 1 / iscale is refined by an fma step, exact where fma is fused (GPUs);
        // lavapipe's is not, and there block 4's d came out one ulp high.
        let cpu_d = f32::from_le_bytes([blk[0], blk[1], blk[2], blk[3]]);
        if (gd[b].to_bits() as i64 - cpu_d.to_bits() as i64).abs() > 1 {
            bad_d += 1;
        }
        for k in 0..64 {
            if gq[b * 64 + k].to_bits() != u32::from_le_bytes([blk[4 + 4 * k], blk[5 + 4 * k], blk[6 + 4 * k], blk[7 + 4 * k]]) {
                bad_q += 1;
            }
        }
    }
    assert_eq!((bad_q, bad_d), (0, 0), "quantized words differing from the CPU's / scales more than an ulp off");
    // Block 4's scale comes from its first largest value, -3: that value maps to -127.
    assert_eq!(want[4 * bb + 4 + 10] as i8, -127);
}

#[test]
fn int8_expert_products_match_cpu_fast_path() {
    let (ne, r, k) = (4usize, 48usize, 3usize);
    let row_bytes = GgmlType::IQ2_XXS.row_bytes(K_COLS).unwrap() as u64;
    // 40 rows a binding: experts straddle parts.
    let Some(gpu) = common::gpu(common::opts(false, Some(row_bytes * 40 + 4))) else { return };
    let w = ds4_quant::random_valid_blocks(GgmlType::IQ2_XXS, 9, ne * r * K_COLS / 256);
    let t = ResidentTensor::upload(&gpu, "exps", GgmlType::IQ2_XXS, &w, ne * r, K_COLS).unwrap();
    assert!(t.parts.len() > 2);
    let ids = [2u32, 0, 3];
    let idb = GpuBuffer::new(&gpu, "ids", k).unwrap();
    idb.write_u32(&gpu, &ids).unwrap();
    let x = k_activations();
    let xb = GpuBuffer::from_slice(&gpu, "x", &x).unwrap();
    let (xq, xd, y) = (GpuBuffer::new(&gpu, "xq", K_COLS / 4).unwrap(), GpuBuffer::new(&gpu, "xd", K_COLS / 256).unwrap(), GpuBuffer::new(&gpu, "y", k * r).unwrap());
    let q = QuantizeQ8::new(&gpu, ActBlocks::Q8_K, &xb, K_COLS, &xq, &xd, K_COLS, 1).unwrap();
    let mv = ExpertMatVecI8::new(&gpu, &t, ne, &idb, &xq, &xd, &y, k).unwrap();
    gpu.run(Step { ntok: 1, pos: 0 }, |e| {
        q.encode(e)?;
        mv.encode(e)
    })
    .unwrap();
    let got = y.read(&gpu, k * r).unwrap();
    // Reference: the dequantized IQ2_XXS rows against the dequantized Q8_K row, in f64 (the same
    // integers times the same scales as the integer dots).
    let mut xa = vec![0f32; K_COLS];
    ds4_quant::dequantize(GgmlType::Q8_K, &cpu_q8k(&x), &mut xa).unwrap();
    let rb = row_bytes as usize;
    let (mut worst, mut worst_lib, mut f32_path) = (0f64, 0f64, 0f64);
    for (s, &id) in ids.iter().enumerate() {
        let ew = &w[id as usize * r * rb..(id as usize + 1) * r * rb];
        let mut deq = vec![0f32; r * K_COLS];
        ds4_quant::dequantize(GgmlType::IQ2_XXS, ew, &mut deq).unwrap();
        let mut lib = vec![0f32; r];
        ds4_quant::matvec(&MatRef::new(GgmlType::IQ2_XXS, ew, r, K_COLS).unwrap(), &x, &mut lib, Precision::Fast);
        for row in 0..r {
            let wr = &deq[row * K_COLS..(row + 1) * K_COLS];
            let want: f64 = wr.iter().zip(&xa).map(|(&a, &b)| a as f64 * b as f64).sum();
            let mag: f64 = wr.iter().zip(&xa).map(|(&a, &b)| (a as f64 * b as f64).abs()).sum();
            let unq: f64 = wr.iter().zip(&x).map(|(&a, &b)| a as f64 * b as f64).sum();
            let bound = 2e-7 * mag;
            worst = common::worse(worst, (got[s * r + row] as f64 - want).abs() / bound);
            worst_lib = common::worse(worst_lib, (lib[row] as f64 - want).abs() / bound);
            f32_path = common::worse(f32_path, (unq - want).abs() / bound);
        }
    }
    eprintln!("int8 expert products: {worst:.4} of the bound (library Fast path {worst_lib:.4}; unquantized activations {f32_path:.1})");
    assert!(worst_lib <= 1.0, "the library's Fast path disagrees with the reference");
    assert!(worst <= 1.0, "int8 expert products off the reference: {worst} x the bound");
    assert!(f32_path > 10.0, "the bound does not tell the quantized product from the f32 one ({f32_path})");
}
