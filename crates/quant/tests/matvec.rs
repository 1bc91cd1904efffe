//! matvec / matmul drivers: odd shapes, ISA-independent semantics, batching, Exact path.
mod common;

use ds4_quant::random::SplitMix64;
use ds4_quant::{dequantize, matmul, matvec, random_valid_blocks, GgmlType, MatRef, Precision};

const ALL: [GgmlType; 7] = [
    GgmlType::Q8_0, GgmlType::Q2_K, GgmlType::Q4_K, GgmlType::IQ2_XXS, GgmlType::F16, GgmlType::BF16, GgmlType::F32,
];

fn randn(seed: u64, n: usize) -> Vec<f32> {
    let mut r = SplitMix64(seed);
    (0..n).map(|_| r.normal()).collect()
}

fn f64_rows(ty: GgmlType, data: &[u8], rows: usize, cols: usize, x: &[f32]) -> Vec<(f64, f64)> {
    let mut wd = vec![0f32; rows * cols];
    dequantize(ty, data, &mut wd).unwrap();
    wd.chunks(cols)
        .map(|r| {
            let s = r.iter().zip(x).map(|(&a, &b)| a as f64 * b as f64).sum();
            let m = r.iter().zip(x).map(|(&a, &b)| (a as f64 * b as f64).abs()).sum();
            (s, m)
        })
        .collect()
}

#[test]
fn matvec_fast_close_to_f64_and_exact_matches_f64() {
    for ty in ALL {
        for (rows, cols) in [(7usize, 256 * 3), (1, 256), (33, 512), (64, 4096)] {
            let nb = rows * cols / ty.block_elems();
            let data = random_valid_blocks(ty, (rows * 1000 + cols) as u64, nb);
            let w = MatRef::new(ty, &data, rows, cols).unwrap();
            let x = randn(rows as u64, cols);
            let want = f64_rows(ty, &data, rows, cols, &x);
            let mut y = vec![0f32; rows];
            matvec(&w, &x, &mut y, Precision::Exact);
            for (r, (&g, &(s, _))) in y.iter().zip(&want).enumerate() {
                assert_eq!(g, s as f32, "{ty:?} exact row {r}");
            }
            matvec(&w, &x, &mut y, Precision::Fast);
            // Fast path quantizes activations to 8 bits for quantized weights: error bound is
            // relative to the magnitude of the products (Q8 rounding ≤ 1/254 of the block max).
            let tol = if matches!(ty, GgmlType::F16 | GgmlType::BF16 | GgmlType::F32) { 1e-5 } else { 2e-2 };
            for (r, (&g, &(s, m))) in y.iter().zip(&want).enumerate() {
                assert!(((g as f64) - s).abs() <= tol * m + 1e-6, "{ty:?} {rows}x{cols} row {r}: {g} vs {s} (mag {m})");
            }
        }
    }
}

#[test]
fn matmul_equals_n_matvecs() {
    for ty in ALL {
        for &(rows, cols, n) in &[(7usize, 256 * 3, 5usize), (33, 512, 1), (200, 1024, 9), (19, 512, 3), (5, 256 * 2, 6), (11, 256, 2)] {
            let data = random_valid_blocks(ty, 42 + rows as u64, rows * cols / ty.block_elems());
            let w = MatRef::new(ty, &data, rows, cols).unwrap();
            let x = randn(7, n * cols);
            for p in [Precision::Fast, Precision::Exact] {
                let mut y = vec![0f32; n * rows];
                matmul(&w, &x, n, &mut y, p);
                for t in 0..n {
                    let mut yt = vec![0f32; rows];
                    matvec(&w, &x[t * cols..(t + 1) * cols], &mut yt, p);
                    assert_eq!(&y[t * rows..(t + 1) * rows], &yt[..], "{ty:?} {p:?} token {t}");
                }
            }
        }
    }
}

#[test]
fn matvec_multithreaded_large_matches_single_thread() {
    let ty = GgmlType::Q4_K;
    let (rows, cols) = (1000, 2048);
    let data = random_valid_blocks(ty, 5, rows * cols / 256);
    let w = MatRef::new(ty, &data, rows, cols).unwrap();
    let x = randn(3, cols);
    let mut y1 = vec![0f32; rows];
    rayon::ThreadPoolBuilder::new().num_threads(1).build().unwrap().install(|| matvec(&w, &x, &mut y1, Precision::Fast));
    let mut y4 = vec![0f32; rows];
    rayon::ThreadPoolBuilder::new().num_threads(4).build().unwrap().install(|| matvec(&w, &x, &mut y4, Precision::Fast));
    assert_eq!(y1, y4);
}

#[test]
fn exact_path_matches_f64_dot_of_gguf_py_dequantized_weights() {
    for r in common::load("dequant.bin") {
        let ty = GgmlType::from_u32(r.ty).unwrap();
        let wf = r.f32s("f32");
        let be = ty.block_elems();
        // rows = number of blocks for block types (cols = one block); F types: a single row.
        let (rows, cols) = if be > 1 { (wf.len() / be, be) } else { (1, wf.len()) };
        let w = MatRef::new(ty, r.bytes("raw"), rows, cols).unwrap();
        let x = randn(rows as u64 + 17, cols);
        let mut y = vec![0f32; rows];
        matvec(&w, &x, &mut y, Precision::Exact);
        for i in 0..rows {
            let want: f64 = wf[i * cols..(i + 1) * cols].iter().zip(&x).map(|(&a, &b)| a as f64 * b as f64).sum();
            assert_eq!(y[i], want as f32, "{} row {i}", r.name);
        }
    }
}
