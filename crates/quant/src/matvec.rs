//! Mat-vec / mat-mul drivers: activation quantization, row partitioning over rayon's current
//! pool, and the Exact (dequantize + f64 dot) reference path.

use rayon::prelude::*;

use crate::blocks::*;
use crate::kernels::{self, DotF, DotQ, DotRows, Kernels, MAX_ROWS};
use crate::quantize::{quantize_row_q8_0, quantize_row_q8_k};
use crate::{dequantize, GgmlType, MatRef, Precision};

/// Activation rows prepared for a weight type's fast kernel.
enum Act<'x> {
    F32(&'x [f32]),
    /// Quantized rows, `stride` bytes each.
    Quant(Vec<u8>, usize),
}

fn prepare<'x>(ty: GgmlType, x: &'x [f32], n: usize, cols: usize, k: &Kernels) -> Act<'x> {
    let (f, bytes): (fn(&[f32], &mut [u8]), usize) = match ty {
        GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => return Act::F32(x),
        GgmlType::Q8_0 => (quantize_row_q8_0, cols / QK8_0 * Q8_0_BYTES),
        GgmlType::Q2_K | GgmlType::Q4_K | GgmlType::IQ2_XXS => (quantize_row_q8_k, cols / QK_K * Q8_K_BYTES),
        t => panic!("matvec: weight type {} has no kernel", t.name()),
    };
    // The IQ2_XXS fast kernel (where the ISA has one) reads the activation row-transposed.
    let transpose = ty == GgmlType::IQ2_XXS && kernels::iq2_xxs_transposed(k).is_some();
    let f = |xr: &[f32], o: &mut [u8]| {
        f(xr, o);
        if transpose {
            kernels::q8k_to_row_major_groups(o);
        }
    };
    let mut buf = vec![0u8; bytes * n];
    // Parallel only when there is enough to quantize to pay for the dispatch (small decode batches
    // of a small model would spend more in rayon than in the work).
    if n >= 4 && n * cols >= 1 << 16 {
        buf.par_chunks_mut(bytes).zip(x.par_chunks(cols)).for_each(|(o, xr)| f(xr, o));
    } else {
        buf.chunks_mut(bytes).zip(x.chunks(cols)).for_each(|(o, xr)| f(xr, o));
    }
    Act::Quant(buf, bytes)
}

/// Row dot of weight row `w` with activation row `t`.
struct Dotter<'a, 'x> {
    act: &'a Act<'x>,
    cols: usize,
    /// Kernel for quantized activations / for f32 activations (the one matching `act`).
    q: DotQ,
    rows: Option<DotRows>,
    f: DotF,
}

impl<'a, 'x> Dotter<'a, 'x> {
    fn new(k: &'static Kernels, ty: GgmlType, act: &'a Act<'x>, cols: usize) -> Self {
        let q = match ty {
            GgmlType::Q8_0 => k.q8_0,
            GgmlType::Q2_K => k.q2_k,
            GgmlType::Q4_K => k.q4_k,
            _ => kernels::iq2_xxs_transposed(k).unwrap_or(k.iq2_xxs),
        };
        // The transposed IQ2_XXS layout has no several-row form.
        let rows = match ty {
            GgmlType::Q8_0 => k.q8_0_rows,
            GgmlType::Q2_K => k.q2_k_rows,
            GgmlType::Q4_K => k.q4_k_rows,
            GgmlType::IQ2_XXS if kernels::iq2_xxs_transposed(k).is_none() => k.iq2_xxs_rows,
            _ => None,
        };
        let f = match ty {
            GgmlType::F32 => k.f32,
            GgmlType::F16 => k.f16,
            _ => k.bf16,
        };
        Dotter { act, cols, q, rows, f }
    }

    #[inline]
    fn dot(&self, w: &[u8], t: usize) -> f32 {
        match self.act {
            Act::F32(x) => (self.f)(w, &x[t * self.cols..(t + 1) * self.cols]),
            Act::Quant(buf, stride) => (self.q)(w, &buf[t * stride..(t + 1) * stride]),
        }
    }

    /// Row `w` against activation rows t0.. of the batch into `out` (one value per row), up to
    /// MAX_ROWS at a time where the kernel table has a several-row form (the same bits as one at a time).
    #[inline]
    fn dot_rows(&self, w: &[u8], t0: usize, out: &mut [f32]) {
        match (self.rows, self.act) {
            (Some(rows), Act::Quant(buf, stride)) if out.len() > 1 => {
                for (c, chunk) in out.chunks_mut(MAX_ROWS).enumerate() {
                    let s = (t0 + c * MAX_ROWS) * stride;
                    rows(w, &buf[s..s + chunk.len() * stride], *stride, chunk);
                }
            }
            _ => {
                for (i, o) in out.iter_mut().enumerate() {
                    *o = self.dot(w, t0 + i);
                }
            }
        }
    }
}

fn rows_per_task(rows: usize, row_bytes: usize, n: usize) -> usize {
    let threads = rayon::current_num_threads().max(1);
    let work = rows * row_bytes * n.max(1);
    if threads == 1 || work < 256 * 1024 {
        return rows.max(1);
    }
    let min_rows = (256 * 1024 / row_bytes.max(1)).max(1);
    rows.div_ceil(threads * 4).max(min_rows).min(rows).max(1)
}

fn check(w: &MatRef, x: &[f32], n: usize, y: &[f32]) {
    assert_eq!(w.row_bytes() * w.rows, w.data.len(), "MatRef data length");
    assert!(w.ty.row_bytes(w.cols).is_some(), "cols not a multiple of the block size");
    assert_eq!(x.len(), n * w.cols, "x length");
    assert_eq!(y.len(), n * w.rows, "y length");
}

/// Exact path: dequantize each row to f32 and dot with f32 activations in f64.
fn exact_rows(w: &MatRef, x: &[f32], n: usize, r0: usize, r1: usize, out: &mut [f32]) {
    let mut buf = vec![0f32; w.cols];
    for r in r0..r1 {
        dequantize(w.ty, w.row(r), &mut buf).expect("dequantize");
        for t in 0..n {
            let xr = &x[t * w.cols..(t + 1) * w.cols];
            let s: f64 = buf.iter().zip(xr).map(|(&a, &b)| a as f64 * b as f64).sum();
            out[(r - r0) * n + t] = s as f32;
        }
    }
}

/// y = W·x over rows.
pub fn matvec(w: &MatRef, x: &[f32], y: &mut [f32], p: Precision) {
    check(w, x, 1, y);
    let rb = w.row_bytes();
    let chunk = rows_per_task(w.rows, rb, 1);
    match p {
        Precision::Exact => {
            y.par_chunks_mut(chunk).enumerate().for_each(|(ci, yc)| {
                let r0 = ci * chunk;
                exact_rows(w, x, 1, r0, r0 + yc.len(), yc);
            });
        }
        Precision::Fast => {
            let k = Kernels::best();
            let act = prepare(w.ty, x, 1, w.cols, k);
            let d = Dotter::new(k, w.ty, &act, w.cols);
            let body = |(ci, yc): (usize, &mut [f32])| {
                let r0 = ci * chunk;
                for (i, o) in yc.iter_mut().enumerate() {
                    *o = d.dot(w.row(r0 + i), 0);
                }
            };
            if chunk >= w.rows {
                y.chunks_mut(chunk.max(1)).enumerate().for_each(body);
            } else {
                y.par_chunks_mut(chunk).enumerate().for_each(body);
            }
        }
    }
}

/// Batched: x is n×cols (token-major), y is n×rows. Activations are quantized once; each weight
/// row is read once and dotted with all n tokens while it is in cache.
pub fn matmul(w: &MatRef, x: &[f32], n: usize, y: &mut [f32], p: Precision) {
    check(w, x, n, y);
    if n == 0 || w.rows == 0 {
        return;
    }
    let rb = w.row_bytes();
    let chunk = rows_per_task(w.rows, rb, n);
    let ntask = w.rows.div_ceil(chunk);
    let k = Kernels::best();
    let act = match p {
        Precision::Fast => Some(prepare(w.ty, x, n, w.cols, k)),
        Precision::Exact => None,
    };
    let run = |ci: usize| -> Vec<f32> {
        let r0 = ci * chunk;
        let r1 = (r0 + chunk).min(w.rows);
        let mut out = vec![0f32; (r1 - r0) * n];
        match &act {
            None => exact_rows(w, x, n, r0, r1, &mut out),
            Some(act) => {
                let d = Dotter::new(k, w.ty, act, w.cols);
                for r in r0..r1 {
                    d.dot_rows(w.row(r), 0, &mut out[(r - r0) * n..(r - r0 + 1) * n]);
                }
            }
        }
        out
    };
    let parts: Vec<Vec<f32>> = if ntask == 1 {
        vec![run(0)]
    } else {
        (0..ntask).into_par_iter().map(run).collect()
    };
    for (ci, part) in parts.iter().enumerate() {
        let r0 = ci * chunk;
        let nr = part.len() / n;
        for i in 0..nr {
            for t in 0..n {
                y[t * w.rows + r0 + i] = part[i * n + t];
            }
        }
    }
}
