//! Op-level check of the one-token products that prepare their own int8 input (`mvq8_q8p_r*f`,
//! `mvq8_q2_k_n1x`) against the stand-alone prologue kernels followed by the plain product.
use crate::gpu::{Gpu, Result, A};
use crate::matvec::{cdiv, launch_down_swiglu, launch_mvq8, launch_mvq8_x, launch_q80, split_layout, XPro, DM};
use crate::probe::{upload as up, CopyCheck};
use crate::stage::me;
use ds4_gguf::GgmlType;

/// A device matrix stack of `z` random valid matrices of type `ty` (split layout where the kernels
/// take it, as at load).
fn matrix(g: &mut Gpu, ty: GgmlType, seed: u64, rows: usize, cols: usize, z: usize) -> Result<(crate::gpu::DBuf, DM)> {
    let row_bytes = ty.row_bytes(cols).ok_or("bad cols")?;
    let data = ds4_quant::random_valid_blocks(ty, seed, rows * cols * z / ty.block_elems());
    let b = g.alloc(data.len())?;
    g.htod(b.ptr, &data)?;
    let mut m = DM { ptr: b.ptr, ty, rows, cols, n_mat: z, row_bytes, split: false };
    split_layout(g, &mut m)?;
    Ok((b, m))
}

/// Bits that differ between two outputs, and their relative L2 error.
fn compare(g: &Gpu, y1: u64, y2: u64, n: usize) -> Result<(usize, f64)> {
    let (mut a, mut b) = (vec![0f32; n], vec![0f32; n]);
    g.dtoh(&mut a, y1)?;
    g.dtoh(&mut b, y2)?;
    let bits = a.iter().zip(&b).filter(|(x, y)| x.to_bits() != y.to_bits()).count();
    let num: f64 = a.iter().zip(&b).map(|(x, y)| ((x - y) as f64).powi(2)).sum();
    let den: f64 = a.iter().map(|x| (*x as f64).powi(2)).sum();
    Ok((bits, (num / den.max(1e-30)).sqrt()))
}

/// Runs every fused form on random data at Flash sizes and the unfused launches it replaces:
/// plain input (out_b: 4096 x 8192), RMS-normed input (q_b: 8192 x 1024, the norm in `rms_rows`),
/// SwiGLU'd input (shared down: 4096 x 2048) and the routed down (Q2_K, 6 of 8 experts by id, SwiGLU
/// with routing weights). `mismatches` counts output values whose bits differ.
pub fn fused_input_checks(seed: u64) -> ds4_model::Result<Vec<CopyCheck>> {
    (|| -> Result<Vec<CopyCheck>> {
        let mut g = Gpu::new(&ds4_quant::iq2xxs_tables::IQ2XXS_GRID_CONST)?;
        let mut rng = ds4_quant::random::SplitMix64(seed);
        let mut v = |n: usize, s: f32| -> Vec<f32> { (0..n).map(|_| rng.normal() * s).collect() };
        let mut out = Vec::new();
        let not_taken = |what: &str| format!("{what}: the fused kernel was not taken");
        for (what, rows, cols) in [("Q8_0 product, plain input", 4096usize, 8192usize), ("Q8_0 product, RMS-normed input", 8192, 1024), ("Q8_0 product, SwiGLU'd input", 4096, 2048)] {
            let (_wb, m) = matrix(&mut g, GgmlType::Q8_0, seed + rows as u64, rows, cols, 1)?;
            let (x, x2, nw) = (up(&g, &v(cols, 2.0))?, up(&g, &v(cols, 2.0))?, up(&g, &v(cols, 0.5))?);
            let (xs, q, d) = (g.alloc(cols * 4)?, g.alloc(cols)?, g.alloc(cols / 32 * 4)?);
            let (y1, y2) = (g.alloc(rows * 4)?, g.alloc(rows * 4)?);
            // Unfused: the prologue kernel writes the Q8_0 copy (or q80_quant does), then the product.
            let pro = match what {
                w if w.contains("RMS") => {
                    g.launch("rms_rows", (1, 1, 1), 1024, 0, &[A::P(x.ptr), A::I(cols as i32), A::P(xs.ptr), A::I(cols as i32), A::I(cols as i32), A::P(nw.ptr), A::F(1e-6), A::P(q.ptr), A::P(d.ptr)])?;
                    XPro::Rms { w: nw.ptr, eps: 1e-6 }
                }
                w if w.contains("SwiGLU") => {
                    g.dtod(xs.ptr, x.ptr, cols * 4)?;
                    g.launch("swiglu", (cdiv(cols, 256), 1, 1), 256, 0, &[A::P(xs.ptr), A::P(x2.ptr), A::P(cols as u64), A::I(cols as i32), A::F(7.0), A::P(0), A::P(q.ptr), A::P(d.ptr), A::P(0), A::P(0)])?;
                    XPro::Swiglu { b: x2.ptr, c: 7.0 }
                }
                _ => {
                    launch_q80(&mut g, x.ptr, 0, cols, 1, q.ptr, d.ptr)?;
                    XPro::Plain
                }
            };
            launch_mvq8(&mut g, &m, m.ptr, 0, 0, q.ptr, d.ptr, 0, y1.ptr, 0, rows, 1)?;
            if !launch_mvq8_x(&mut g, &m, m.ptr, x.ptr, pro, y2.ptr)? {
                return Err(not_taken(what));
            }
            let (bits, err) = compare(&g, y1.ptr, y2.ptr, rows)?;
            out.push(CopyCheck { what, values: rows, mismatches: bits, rel_err: err });
        }
        // Routed down: Q2_K, 6 slots reading experts by id, each slot's SwiGLU weighted.
        let (e, ff, k, ne) = (4096usize, 2048usize, 6usize, 8usize);
        let (_wb, m) = matrix(&mut g, GgmlType::Q2_K, seed + 99, e, ff, ne)?;
        let ids: Vec<i32> = vec![7, 0, 3, 5, 1, 6];
        let eids = g.alloc(k * 4)?;
        g.htod(eids.ptr, &ids)?;
        let (a, b, ew) = (up(&g, &v(k * ff, 2.0))?, up(&g, &v(k * ff, 2.0))?, up(&g, &v(k, 0.3))?);
        let (a1, q, d) = (g.alloc(k * ff * 4)?, g.alloc(k * ff)?, g.alloc(k * ff / 256 * 4)?);
        let (y1, y2) = (g.alloc(k * e * 4)?, g.alloc(k * e * 4)?);
        g.dtod(a1.ptr, a.ptr, k * ff * 4)?;
        g.launch("swiglu", (cdiv(k * ff, 256), 1, 1), 256, 0, &[A::P(a1.ptr), A::P(b.ptr), A::P((k * ff) as u64), A::I(ff as i32), A::F(7.0), A::P(ew.ptr), A::P(0), A::P(0), A::P(q.ptr), A::P(d.ptr)])?;
        launch_mvq8(&mut g, &m, m.ptr, m.mat_bytes(), eids.ptr, q.ptr, d.ptr, ff, y1.ptr, e, e, k)?;
        let what = "Q2_K routed down, SwiGLU'd input";
        if !launch_down_swiglu(&mut g, &m, eids.ptr, a.ptr, b.ptr, ew.ptr, 7.0, y2.ptr, k)? {
            return Err(not_taken(what));
        }
        let (bits, err) = compare(&g, y1.ptr, y2.ptr, k * e)?;
        out.push(CopyCheck { what, values: k * e, mismatches: bits, rel_err: err });
        g.sync()?;
        Ok(out)
    })()
    .map_err(me)
}

