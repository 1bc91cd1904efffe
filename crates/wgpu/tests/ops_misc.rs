//! RMS norm, RoPE, SwiGLU and the greedy pick on the test adapter against the CPU code of
//! `ds4_model` (ops::rms_norm, rope::Rope::apply, moe::swiglu_clamped) and an f64 log-sum-exp.
mod common;

use ds4_model::rope::Rope as CpuRope;
use ds4_wgpu::ops::{Argmax, Rope, RmsNorm, SwiGlu};
use ds4_wgpu::{GpuBuffer, Step};

#[test]
fn rms_norm_matches_cpu() {
    let Some(gpu) = common::gpu(common::opts(false, None)) else { return };
    let (n, ntok) = (4096, 3);
    let x: Vec<f32> = common::normals(1, n * ntok).iter().map(|v| v * 3.0).collect();
    let g: Vec<f32> = common::normals(2, n).iter().map(|v| 1.0 + 0.1 * v).collect();
    for weighted in [true, false] {
        let xb = GpuBuffer::new(&gpu, "x", n * 4).unwrap();
        xb.write(&gpu, &x).unwrap();
        let gb = GpuBuffer::from_slice(&gpu, "g", &g).unwrap();
        let op = RmsNorm::new(&gpu, &xb, n, weighted.then_some(&gb), 1e-6, 4).unwrap();
        gpu.run(Step { ntok: ntok as u32, pos: 0 }, |e| op.encode(e)).unwrap();
        let got = xb.read(&gpu, n * ntok).unwrap();
        let mut want = x.clone();
        for row in want.chunks_mut(n) {
            ds4_model::ops::rms_norm(row, weighted.then_some(&g[..]), 1e-6);
        }
        // f32 tree sum of 4096 squares vs the CPU's f64 sum: < 2e-6 relative; 4e-6 allowed.
        let worst = got.iter().zip(&want).map(|(a, b)| ((a - b).abs() / (4e-6 * b.abs() + 1e-7)) as f64).fold(0.0, common::worse);
        eprintln!("rms norm weighted={weighted}: {worst:.3} of the bound");
        assert!(worst <= 1.0, "rms norm (weighted={weighted}) off by {worst} x the bound");
    }
}

#[test]
fn rope_matches_cpu_at_large_positions() {
    let Some(gpu) = common::gpu(common::opts(false, None)) else { return };
    let cfg = ds4_model::synth::shape("flash").expect("flash shape");
    let (n_head, hd, ntok) = (4, cfg.head_dim, 3);
    for ratio in [0, 4] {
        let cpu = CpuRope::for_layer(&cfg, ratio);
        for inverse in [false, true] {
            for pos in [0u32, 4093, 1_000_000 - 3] {
                let x = common::normals(10 + pos as u64, ntok * n_head * hd);
                let xb = GpuBuffer::new(&gpu, "x", 4 * n_head * hd).unwrap();
                xb.write(&gpu, &x).unwrap();
                let op = Rope::new(&gpu, &xb, n_head, hd, cpu.freqs(), inverse, 4).unwrap();
                gpu.run(Step { ntok: ntok as u32, pos }, |e| op.encode(e)).unwrap();
                let got = xb.read(&gpu, x.len()).unwrap();
                let mut want = x.clone();
                for (i, head) in want.chunks_mut(hd).enumerate() {
                    cpu.apply(head, pos as usize + i / n_head, inverse);
                }
                // Angle error <= 8 fract additions x 2^-24 turns = 3.0e-6 rad, plus f32 rounding of
                // the polynomials and the rotation: bound 3.5e-6 x (|x0| + |x1|) per pair.
                let mut worst = 0f64;
                for (pa, pb) in x.chunks(2).zip(got.chunks(2).zip(want.chunks(2))) {
                    let mag = (pa[0].abs() + pa[1].abs()) as f64;
                    for k in 0..2 {
                        let err = (pb.0[k] - pb.1[k]).abs() as f64;
                        worst = common::worse(worst, err / (3.5e-6 * mag + 1e-12));
                    }
                }
                eprintln!("rope ratio={ratio} inverse={inverse} pos={pos}: {worst:.3} of the bound");
                assert!(worst <= 1.0, "rope (ratio {ratio}, inverse {inverse}, pos {pos}) off by {worst} x the bound");
            }
        }
    }
}

#[test]
fn swiglu_matches_cpu() {
    let Some(gpu) = common::gpu(common::opts(false, None)) else { return };
    // Buffers hold the op's 8 rows; the steps use 5 and then 2.
    let (n, ntok) = (1000, 5);
    let a: Vec<f32> = common::normals(3, n * 8).iter().map(|v| v * 6.0).collect();
    let b: Vec<f32> = common::normals(4, n * 8).iter().map(|v| v * 6.0).collect();
    for clamp in [Some(7.0f32), None] {
        let ab = GpuBuffer::from_slice(&gpu, "a", &a).unwrap();
        let bb = GpuBuffer::from_slice(&gpu, "b", &b).unwrap();
        let op = SwiGlu::new(&gpu, &ab, &bb, n, clamp, 8).unwrap();
        gpu.run(Step { ntok: ntok as u32, pos: 0 }, |e| op.encode(e)).unwrap();
        let got = ab.read(&gpu, n * ntok).unwrap();
        let mut worst = 0f64;
        for i in 0..n * ntok {
            let want = match clamp {
                Some(c) => ds4_model::moe::swiglu_clamped(a[i], b[i], c),
                None => ds4_model::ops::silu(a[i]) * b[i],
            };
            // Vulkan's exp is within (3 + 2|x|) ulp; the rest is a few f32 roundings.
            let bound = (8.0 + 2.0 * a[i].abs() as f64) * f32::EPSILON as f64 * want.abs() as f64 + 1e-30;
            worst = common::worse(worst, (got[i] - want).abs() as f64 / bound);
        }
        eprintln!("swiglu clamp={clamp:?}: {worst:.3} of the bound");
        assert!(worst <= 1.0, "swiglu (clamp {clamp:?}) off by {worst} x the bound");
    }
    // Untouched beyond the step's rows.
    let ab = GpuBuffer::from_slice(&gpu, "a", &a).unwrap();
    let bb = GpuBuffer::from_slice(&gpu, "b", &b).unwrap();
    let op = SwiGlu::new(&gpu, &ab, &bb, n, None, 8).unwrap();
    gpu.run(Step { ntok: 2, pos: 0 }, |e| op.encode(e)).unwrap();
    let got = ab.read(&gpu, n * 8).unwrap();
    assert_eq!(&got[2 * n..], &a[2 * n..]);
}

/// (first index of the maximum, log-sum-exp) in f64, skipping NaN and -inf.
fn cpu_pick(x: &[f32]) -> (u32, f64, f64) {
    let mut best = (0u32, f64::NEG_INFINITY);
    for (i, &v) in x.iter().enumerate() {
        if (v as f64) > best.1 {
            best = (i as u32, v as f64);
        }
    }
    let s: f64 = x.iter().filter(|v| v.is_finite()).map(|&v| (v as f64 - best.1).exp()).sum();
    (best.0, best.1, best.1 + s.ln())
}

#[test]
fn argmax_matches_cpu() {
    let Some(gpu) = common::gpu(common::opts(false, None)) else { return };
    let n = 129_280;
    let mut x: Vec<f32> = common::normals(5, n).iter().map(|v| v * 4.0).collect();
    // A tie for the maximum (the first index wins), and entries that must never win or count.
    let m = x.iter().cloned().fold(f32::MIN, f32::max) + 1.0;
    x[77_777] = m;
    x[100_000] = m;
    x[5] = f32::NAN;
    x[6] = f32::NEG_INFINITY;
    let xb = GpuBuffer::from_slice(&gpu, "logits", &x).unwrap();
    let op = Argmax::new(&gpu, &xb, n).unwrap();
    gpu.run(Step { ntok: 1, pos: 0 }, |e| op.encode(e)).unwrap();
    let pick = op.result(&gpu).unwrap();
    let (idx, max, lse) = cpu_pick(&x);
    eprintln!("argmax: {pick:?} vs cpu index {idx} lse {lse}");
    assert_eq!(pick.index, idx);
    assert_eq!(pick.index, 77_777);
    assert_eq!(pick.max as f64, max);
    // f32 sums of exp over ~505 values per thread then a tree, and exp within (3 + 2|x|) ulp: < 5e-5.
    assert!((pick.lse as f64 - lse).abs() < 5e-5, "lse {} vs {lse}", pick.lse);
    assert!((pick.logprob as f64 - (max - lse)).abs() < 5e-5, "logprob {} vs {}", pick.logprob, max - lse);

    // Every value -inf or NaN: index 0, like the CUDA kernel.
    let bad: Vec<f32> = (0..1000).map(|i| if i % 2 == 0 { f32::NEG_INFINITY } else { f32::NAN }).collect();
    let bb = GpuBuffer::from_slice(&gpu, "bad", &bad).unwrap();
    let op = Argmax::new(&gpu, &bb, bad.len()).unwrap();
    gpu.run(Step { ntok: 1, pos: 0 }, |e| op.encode(e)).unwrap();
    assert_eq!(op.result(&gpu).unwrap().index, 0);
}
