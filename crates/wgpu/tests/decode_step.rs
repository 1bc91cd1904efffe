//! A small decode step built once and run for several tokens: norm -> gate/up mat-vecs (Q4_K,
//! IQ2_XXS) -> SwiGLU -> down (Q2_K) -> norm -> head (Q8_0) -> greedy pick, on a forced small weight
//! binding so tensors are split. Per token, only the input row and the 16-byte step uniform are
//! written: no weight upload, bind group, pipeline or buffer is created (counters), and the pick
//! matches a CPU chain over `ds4_quant::dequantize`d weights computed in f64.
mod common;

use ds4_quant::GgmlType;
use ds4_wgpu::ops::{Argmax, MatVec, Product, RmsNorm, SwiGlu};
use ds4_wgpu::{GpuBuffer, ResidentTensor, Step};

const N: usize = 512;
const FF: usize = 768;
const VOCAB: usize = 1000;

struct W {
    ty: GgmlType,
    rows: usize,
    cols: usize,
    bytes: Vec<u8>,
}

impl W {
    fn new(ty: GgmlType, rows: usize, cols: usize, seed: u64) -> Self {
        Self { ty, rows, cols, bytes: ds4_quant::random_valid_blocks(ty, seed, rows * cols / ty.block_elems()) }
    }
    fn matvec_f64(&self, x: &[f64]) -> Vec<f64> {
        let mut d = vec![0f32; self.rows * self.cols];
        ds4_quant::dequantize(self.ty, &self.bytes, &mut d).unwrap();
        d.chunks(self.cols).map(|r| r.iter().zip(x).map(|(&a, &b)| a as f64 * b).sum()).collect()
    }
}

fn norm_f64(x: &[f64]) -> Vec<f64> {
    let inv = 1.0 / (x.iter().map(|v| v * v).sum::<f64>() / x.len() as f64 + 1e-6).sqrt();
    x.iter().map(|v| v * inv).collect()
}

fn cpu_chain(ws: &[W; 4], x: &[f32]) -> Vec<f64> {
    let h = norm_f64(&x.iter().map(|&v| v as f64).collect::<Vec<_>>());
    let (g, u) = (ws[0].matvec_f64(&h), ws[1].matvec_f64(&h));
    let a: Vec<f64> = g.iter().zip(&u).map(|(&g, &u)| g.min(10.0) / (1.0 + (-g.min(10.0)).exp()) * u.clamp(-10.0, 10.0)).collect();
    let d = norm_f64(&ws[2].matvec_f64(&a));
    ws[3].matvec_f64(&d)
}

#[test]
fn decode_steps_bind_nothing_per_token() {
    let Some(gpu) = common::gpu(common::opts(false, Some(64 << 10))) else { return };
    let ws = [
        W::new(GgmlType::Q4_K, FF, N, 1),
        W::new(GgmlType::IQ2_XXS, FF, N, 2),
        W::new(GgmlType::Q2_K, N, FF, 3),
        W::new(GgmlType::Q8_0, VOCAB, N, 4),
    ];
    let t: Vec<ResidentTensor> =
        ws.iter().enumerate().map(|(i, w)| ResidentTensor::upload(&gpu, &format!("w{i}"), w.ty, &w.bytes, w.rows, w.cols).unwrap()).collect();
    assert!(t.iter().all(|t| t.parts.len() > 1), "every tensor should be split at a 64 KiB binding");
    let x = GpuBuffer::new(&gpu, "x", N).unwrap();
    let (g, u) = (GpuBuffer::new(&gpu, "g", FF).unwrap(), GpuBuffer::new(&gpu, "u", FF).unwrap());
    let d = GpuBuffer::new(&gpu, "d", N).unwrap();
    let logits = GpuBuffer::new(&gpu, "logits", VOCAB).unwrap();
    let norm_x = RmsNorm::new(&gpu, &x, N, None, 1e-6, 1).unwrap();
    let gate = MatVec::new(&gpu, &t[0], &x, &g, Product::Vec).unwrap();
    let up = MatVec::new(&gpu, &t[1], &x, &u, Product::Vec).unwrap();
    let act = SwiGlu::new(&gpu, &g, &u, FF, Some(10.0), 1).unwrap();
    let down = MatVec::new(&gpu, &t[2], &g, &d, Product::Vec).unwrap();
    let norm_d = RmsNorm::new(&gpu, &d, N, None, 1e-6, 1).unwrap();
    let head = MatVec::new(&gpu, &t[3], &d, &logits, Product::Vec).unwrap();
    let pick = Argmax::new(&gpu, &logits, VOCAB).unwrap();

    let loaded = gpu.counters();
    let steps = 4;
    for s in 0..steps {
        let xin = common::normals(50 + s, N);
        x.write(&gpu, &xin).unwrap();
        gpu.run(Step { ntok: 1, pos: s as u32 }, |e| {
            norm_x.encode(e)?;
            gate.encode(e)?;
            up.encode(e)?;
            act.encode(e)?;
            down.encode(e)?;
            norm_d.encode(e)?;
            head.encode(e)?;
            pick.encode(e)
        })
        .unwrap();
        let p = pick.result(&gpu).unwrap();
        let want = cpu_chain(&ws, &xin);
        let mut order: Vec<usize> = (0..VOCAB).collect();
        order.sort_by(|&a, &b| want[b].total_cmp(&want[a]));
        let gap = want[order[0]] - want[order[1]];
        eprintln!("step {s}: gpu {} cpu {} (gap to second {gap:.2e}), max {} vs {}", p.index, order[0], p.max, want[order[0]]);
        // The logits agree to ~1e-5 relative; a tie closer than that could legitimately flip.
        if gap > 1e-3 * want[order[0]].abs().max(1.0) {
            assert_eq!(p.index as usize, order[0], "step {s}");
        }
        assert!((p.max as f64 - want[order[0]]).abs() <= 1e-4 * want[order[0]].abs().max(1.0));
    }
    let after = gpu.counters();
    assert_eq!(
        (after.weight_uploads, after.weight_bytes, after.bind_groups, after.pipelines, after.buffers),
        (loaded.weight_uploads, loaded.weight_bytes, loaded.bind_groups, loaded.pipelines, loaded.buffers),
        "something was uploaded, bound, compiled or allocated per token"
    );
    assert_eq!(after.step_writes - loaded.step_writes, steps);
    assert_eq!(after.activation_writes - loaded.activation_writes, steps);
}
