//! GPU tests against the CPU backend (our reference). They need an NVIDIA GPU and skip with a message
//! otherwise. Run on the device with `--nocapture` to see the measured differences.
#![cfg(feature = "cuda")]
use ds4_gguf::{GgmlType, GgufFile};
use ds4_model::synth::{self, Mix, SynthSpec};
use ds4_model::{Config, LayerRange, Logits, Options, Stage, Weights};
use ds4_quant::{matmul, MatRef, Precision};
use ds4_cuda::WeightPlace;
use std::sync::Arc;

fn gpu_present() -> bool {
    ds4_cuda::gpu::preload_libs();
    // SAFETY: probes whether libcuda can be opened.
    let ok = unsafe { cudarc::driver::sys::is_culib_present() } && cudarc::driver::CudaContext::new(0).is_ok();
    if !ok {
        eprintln!("SKIPPED: no CUDA device");
    }
    ok
}

fn rel_err(a: &[f32], b: &[f32]) -> f64 {
    let num: f64 = a.iter().zip(b).map(|(x, y)| ((x - y) as f64).powi(2)).sum();
    let den: f64 = b.iter().map(|y| (*y as f64).powi(2)).sum();
    (num / den.max(1e-30)).sqrt()
}

#[test]
fn matmul_kernels_match_cpu() {
    if !gpu_present() {
        return;
    }
    for ty in [GgmlType::Q8_0, GgmlType::Q2_K, GgmlType::Q4_K, GgmlType::IQ2_XXS, GgmlType::F16] {
        for (rows, cols, n, split) in [(96usize, 4096usize, 1usize, false), (96, 4096, 1, true), (40, 2048, 3, true), (64, 1024, 37, true), (13, 1280, 5, true), (64, 4096, 8, true), (40, 2304, 13, true), (7, 512, 1, true), (3000, 4096, 1, true)] {
            let nb = rows * cols / ty.block_elems();
            let data = ds4_quant::random_valid_blocks(ty, 17 + rows as u64, nb);
            let x: Vec<f32> = (0..n * cols).map(|i| ((i * 7919 % 1000) as f32 / 500.0 - 1.0) * 0.7).collect();
            let w = MatRef::new(ty, &data, rows, cols).unwrap();
            let mut want = vec![0f32; n * rows];
            matmul(&w, &x, n, &mut want, Precision::Exact);
            let (mv, gemm) = ds4_cuda::matmul_paths(ty, rows, cols, &data, &x, n, split).unwrap();
            let (e1, e2) = (rel_err(&mv, &want), rel_err(&gemm, &want));
            println!("op {:<8} {rows}x{cols} n={n} split={split}: mat-vec rel err {e1:.2e}, f16 GEMM rel err {e2:.2e}", ty.name());
            assert!(e1 < 1e-5, "mat-vec {} rel err {e1}", ty.name());
            assert!(e2 < 3e-3, "GEMM {} rel err {e2}", ty.name());
        }
    }
}

struct Model {
    stage: Stage,
}

fn load(shape: &str, mix: Mix, seed: u64, qat: bool) -> Model { load_p(shape, mix, seed, qat, Precision::Exact) }

fn load_p(shape: &str, mix: Mix, seed: u64, qat: bool, precision: Precision) -> Model {
    let dir = std::env::var("DS4_TEST_DIR").unwrap_or_else(|_| std::env::temp_dir().to_string_lossy().into_owned());
    let path = std::path::Path::new(&dir).join(format!("ds4cuda-{}-{:?}-{seed}.gguf", shape.replace(':', "_"), mix));
    if !path.exists() {
        synth::write(&SynthSpec { shape, mix, seed, layers: None, vocab: None }, &path, |_, _| {}).unwrap();
    }
    let f = Arc::new(GgufFile::open(&path).unwrap());
    let cfg = Config::from_gguf(&f).unwrap();
    let w = Weights::bind_mapped(f, &path, &cfg, LayerRange::full(&cfg)).unwrap();
    Model { stage: Stage::new(cfg, w, Options { precision, qat }) }
}

/// Greedy decoding on both backends from the same prompt (prefilled in chunks); returns
/// (cpu tokens, gpu tokens, worst relative logits error, first-step top-2 margin at divergence).
fn compare(m: &mut Model, prompt: &[u32], chunk: usize, steps: usize, ctx: usize, fast_gpu: bool, place: WeightPlace) -> (Vec<u32>, Vec<u32>, f64) {
    let mut gpu = ds4_cuda::CudaStage::new_placed(&m.stage, ctx, chunk, place).unwrap();
    gpu.ops.fast_experts = fast_gpu;
    gpu.ops.fast_q8 = fast_gpu;
    // Token-identity runs keep every product in f32 (the f16 GEMM prefill path is checked op by op).
    gpu.ops.gemm_min = usize::MAX;
    let mut kc = m.stage.new_kv(ctx);
    let mut kg = m.stage.new_kv(ctx);
    let mut worst = 0f64;
    let (mut lc, mut lg) = (Vec::new(), Vec::new());
    m.stage.trace = Some(Vec::new());
    gpu.trace = Some(Vec::new());
    for c in prompt.chunks(chunk) {
        lc = m.stage.forward(&mut kc, c, None, Logits::Last).unwrap().to_vec();
        lg = gpu.forward(&mut kg, c, None, Logits::Last).unwrap().to_vec();
        worst = worst.max(rel_err(&lg, &lc));
    }
    let argmax = |l: &[f32]| l.iter().enumerate().fold((0usize, f32::NEG_INFINITY), |b, (i, &v)| if v > b.1 { (i, v) } else { b }).0 as u32;
    let (mut tc, mut tg) = (Vec::new(), Vec::new());
    let mut first_logits = Vec::new();
    let mut blown = false;
    for step in 0..steps {
        let (a, b) = (argmax(&lc), argmax(&lg));
        // Layer-by-layer HC-stream error of the last forward call (prefill, then each decode step).
        let (ct, gt) = (m.stage.trace.replace(Vec::new()).unwrap(), gpu.trace.replace(Vec::new()).unwrap());
        let nl = m.stage.cfg.n_layer;
        let layer_errs: Vec<f64> = ct.iter().zip(&gt).rev().take(nl).rev().map(|(c, g)| rel_err(g, c)).collect();
        let jump = !blown && layer_errs.iter().any(|&e| e > 1e-2);
        blown |= jump;
        if step < 2 || step % 16 == 0 || jump || (a != b && tc.iter().zip(&tg).all(|(x, y)| x == y)) {
            let errs: Vec<String> = layer_errs.iter().enumerate().map(|(l, e)| format!("L{l}:{e:.1e}")).collect();
            println!("  step {step} (ratios {:?}): {}", &m.stage.cfg.compress_ratios[..nl], errs.join(" "));
        }
        tc.push(a);
        tg.push(b);
        lc = m.stage.forward(&mut kc, &[a], None, Logits::Last).unwrap().to_vec();
        lg = gpu.forward(&mut kg, &[b], None, Logits::Last).unwrap().to_vec();
        if step < 4 {
            first_logits.push(lg.clone());
        }
        if a == b {
            worst = worst.max(rel_err(&lg, &lc));
        }
    }
    // Snapshot/rewind: back to the end of the prompt, decode again through the CUDA graph (tracing
    // off): the same tokens, and bit-identical logits, as the first (launch-by-launch) decode.
    gpu.trace = None;
    let mut kr = m.stage.new_kv(ctx);
    kr.pos = prompt.len();
    let mut again = Vec::new();
    let mut t = tg[0];
    for i in 0..4.min(steps) {
        again.push(t);
        let l = gpu.forward(&mut kr, &[t], None, Logits::Last).unwrap();
        assert!(l == first_logits[i].as_slice(), "graph decode step {i}: logits differ from the launch-by-launch decode");
        t = argmax(l);
    }
    assert_eq!(again, tg[..again.len()].to_vec(), "rewind to the prefill snapshot changed the tokens");
    // The device token path (top-1 on the GPU, a node of the decode graph) agrees with argmax of the
    // downloaded logits, and the logits it leaves on the device are the graph decode's.
    let mut kr2 = m.stage.new_kv(ctx);
    kr2.pos = prompt.len();
    let mut t = tg[0];
    for i in 0..4.min(steps.saturating_sub(1)) {
        let (top1, logprob) = gpu.forward_argmax(&mut kr2, &[t], None).unwrap();
        let l = gpu.last_logits().unwrap();
        assert!(l == first_logits[i].as_slice(), "device-argmax step {i}: logits differ from the first decode");
        assert_eq!(top1, argmax(l), "device argmax, step {i}");
        // Its log-probability is the host's log-softmax of the same row (f64 reference).
        let m = l[top1 as usize] as f64;
        let want = -l.iter().map(|&v| (v as f64 - m).exp()).sum::<f64>().ln();
        assert!((logprob as f64 - want).abs() <= 1e-5 * want.abs().max(1.0), "device log-probability {logprob} vs {want}, step {i}");
        assert_eq!(top1, tg[i + 1], "device argmax token, step {i}");
        t = top1;
    }
    let s = ds4_cuda::CudaStage::stats();
    println!("device allocations so far {}, weight uploads so far {}", s.device_allocs, s.weight_uploads);
    (tc, tg, worst)
}

fn model_case(shape: &str, mix: Mix, prompt_len: usize, chunk: usize, steps: usize) { model_case_opts(shape, mix, prompt_len, chunk, steps, true) }

fn model_case_opts(shape: &str, mix: Mix, prompt_len: usize, chunk: usize, steps: usize, qat: bool) { model_case_placed(shape, mix, prompt_len, chunk, steps, qat, WeightPlace::Device) }

fn model_case_placed(shape: &str, mix: Mix, prompt_len: usize, chunk: usize, steps: usize, qat: bool, place: WeightPlace) {
    if !gpu_present() {
        return;
    }
    let mut m = load(shape, mix, 11, qat);
    let v = m.stage.cfg.n_vocab as u32;
    let prompt: Vec<u32> = (0..prompt_len as u32).map(|i| (i * 2654435761u32 >> 7) % v).collect();
    let ctx = prompt_len + steps + 8;
    let allocs0 = ds4_cuda::CudaStage::stats();
    let (tc, tg, worst) = compare(&mut m, &prompt, chunk, steps, ctx, false, place);
    let same = tc.iter().zip(&tg).take_while(|(a, b)| a == b).count();
    println!("model {shape} {mix:?} (qat {qat}, weights {place:?}): prompt {prompt_len} (chunks of {chunk}), {steps} greedy steps: {same}/{steps} tokens identical; worst logits rel err {worst:.2e}");
    println!("  cpu: {:?}", &tc[..16.min(steps)]);
    println!("  gpu: {:?}", &tg[..16.min(steps)]);
    let _ = allocs0;
    assert!(worst < 2e-2, "logits rel err {worst}");
    assert_eq!(tc, tg, "greedy tokens differ");
}

#[test]
fn tiny_q2_greedy_64_matches_cpu() {
    model_case("tiny", Mix::Q2, 40, 40, 64);
}

#[test]
fn tiny_q4_chunked_prefill_greedy_64_matches_cpu() {
    // Chunks of 24 cross compressor windows and the indexer threshold (top-k 8 → after 36 positions).
    model_case("tiny", Mix::Q4, 100, 24, 64);
}

/// Weights read in place from the registered host mapping (`--cuda-weights host`): the file's layout
/// and the kernels that read it; the same comparison with the CPU as the device copy passes.
#[test]
fn tiny_q4_host_weights_greedy_64_matches_cpu() {
    model_case_placed("tiny", Mix::Q4, 100, 24, 64, true, WeightPlace::Host);
}

/// Greedy tokens of a stage with its weights copied to the GPU and of one reading them in place from
/// host memory (default kernel choices: cuBLAS / grouped-GEMM prefill, graph decode), and the GPU memory
/// each takes (cuMemGetInfo around construction): the host stage none for the weight matrices. With
/// `strict` (`Precision::Exact`: both read f32 activations; the two layouts differ only in summation
/// order) the tokens must be equal. Under `Precision::Fast` the device copy's split-layout IQ2_XXS /
/// Q8_0 rows take int8 activations, which the file layout the host stage reads has no kernel for, so
/// the two runs differ by activation rounding: the agreement is printed, not asserted.
fn host_equals_device_copy(shape: &str, mix: Mix, prompt_len: usize, chunk: usize, steps: usize, precision: Precision, qat: bool, strict: bool) {
    if !gpu_present() {
        return;
    }
    let m = load_p(shape, mix, 11, qat, precision);
    let v = m.stage.cfg.n_vocab as u32;
    let prompt: Vec<u32> = (0..prompt_len as u32).map(|i| (i * 2654435761u32 >> 7) % v).collect();
    let ctx = prompt_len + steps + 8;
    let run = |place: WeightPlace| -> (Vec<u32>, f64, u64, ds4_cuda::GpuPlan, f64) {
        ds4_cuda::gpu::preload_libs();
        // The primary context stays retained while the stage is built in it (as free0 is measured).
        let _ctx0 = cudarc::driver::CudaContext::new(0).unwrap();
        let free0 = cudarc::driver::result::mem_get_info().unwrap().0 as u64;
        let mut gpu = ds4_cuda::CudaStage::new_placed(&m.stage, ctx, chunk, place).unwrap();
        let free1 = cudarc::driver::result::mem_get_info().unwrap().0 as u64;
        let mut kv = m.stage.new_kv(ctx);
        let mut toks = Vec::new();
        let mut tok = None;
        for c in prompt.chunks(chunk) {
            tok = Some(gpu.forward_argmax(&mut kv, c, None).unwrap().0);
        }
        let t0 = std::time::Instant::now();
        for _ in 0..steps {
            let t = tok.unwrap();
            toks.push(t);
            tok = Some(gpu.forward_argmax(&mut kv, &[t], None).unwrap().0);
        }
        let secs = t0.elapsed().as_secs_f64();
        (toks, steps as f64 / secs, free0.saturating_sub(free1), gpu.ops.gpu_plan, gpu.ops.weight_bytes as f64)
    };
    let (td, dtps, dused, dplan, wbytes) = run(WeightPlace::Device);
    let (th, htps, hused, hplan, _) = run(WeightPlace::Host);
    let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
    println!("{shape} {mix:?} {precision:?} qat {qat}: weights {:.2} GiB; device copy: {:.2} GiB of GPU memory taken, decode {dtps:.1} t/s; host: {:.2} GiB taken, decode {htps:.1} t/s", wbytes / (1u64 << 30) as f64, gib(dused), gib(hused));
    println!("  device plan {dplan:?}
  host plan {hplan:?}");
    let same = td.iter().zip(&th).take_while(|(a, b)| a == b).count();
    println!("  {same}/{steps} tokens identical
  device: {:?}
  host:   {:?}", &td[..16.min(steps)], &th[..16.min(steps)]);
    assert_eq!(hplan.weights, 0);
    assert_eq!(dplan.weights as f64, wbytes);
    // The host stage's GPU memory is its plan without weights (vectors, KV, work) plus the context's
    // own (kernel module, cuBLAS workspaces: under 1 GiB); the device copy's holds the weights too.
    assert!(hused <= hplan.total() + (1 << 30), "host mode took {hused} bytes of GPU memory, plan {}", hplan.total());
    assert!(dused >= dplan.weights, "device mode took {dused} bytes for {} bytes of weights", dplan.weights);
    if strict {
        assert_eq!(td, th, "greedy tokens differ between the device copy and the host-mapped weights");
    }
}

/// Strict without the QAT simulation: with it, the first H200 run (2026-12-04) kept 44/64 tokens: its
/// FP8 rounding steps turn the layouts' summation-order differences into whole steps on this random
/// model (as between CPU and GPU at Flash size, bench/results/cuda/README.md); that case is printed.
#[test]
fn tiny_q2_host_weights_equal_device_copy() {
    host_equals_device_copy("tiny", Mix::Q2, 40, 40, 64, Precision::Exact, false, true);
    host_equals_device_copy("tiny", Mix::Q2, 40, 40, 64, Precision::Exact, true, false);
    host_equals_device_copy("tiny", Mix::Q2, 40, 40, 64, Precision::Fast, true, false);
}

/// Flash shape without the QAT simulation (its FP8 rounding steps turn summation-order differences into
/// whole steps: see bench/results/cuda/README.md), then with the engine's defaults (Fast, QAT on).
#[test]
#[ignore = "flash-shaped: ~10 GB synthetic file; run on the device with --ignored"]
fn flash4_q2_host_weights_equal_device_copy() {
    host_equals_device_copy("flash:4", Mix::Q2, 160, 64, 64, Precision::Exact, false, true);
    host_equals_device_copy("flash:4", Mix::Q2, 160, 64, 64, Precision::Fast, true, false);
}

#[test]
#[ignore = "flash-shaped: ~10 GB synthetic file; run on the device with --ignored"]
fn flash4_q2_greedy_64_matches_cpu() {
    model_case("flash:4", Mix::Q2, 160, 64, 64);
}

/// The same Flash-shaped comparison without the FP8/FP4 rounding simulation (on both backends): its
/// discontinuities turn f32 summation-order differences (~1e-7) into whole rounding steps, which the
/// random-weight model's near-tied expert routing then amplifies; without them the comparison isolates
/// the kernels.
#[test]
#[ignore = "flash-shaped: ~10 GB synthetic file; run on the device with --ignored"]
fn flash4_q2_noqat_greedy_64_matches_cpu() {
    model_case_opts("flash:4", Mix::Q2, 160, 64, 64, false);
}

/// Worst relative error of the GPU's slots `y` (slot i reads matrix z-1-i of `data`, activation row
/// i or the shared one) against the CPU's `Precision::Fast` mat-vec.
#[allow(clippy::too_many_arguments)]
fn worst_vs_cpu_fast(ty: GgmlType, rows: usize, cols: usize, z: usize, per_slot: bool, data: &[u8], x: &[f32], y: &[f32]) -> f64 {
    let row_bytes = ty.row_bytes(cols).unwrap();
    let mut worst = 0f64;
    for i in 0..z {
        let mat = z - 1 - i;
        let w = MatRef::new(ty, &data[mat * rows * row_bytes..][..rows * row_bytes], rows, cols).unwrap();
        let xrow = &x[if per_slot { i * cols } else { 0 }..][..cols];
        let mut want = vec![0f32; rows];
        ds4_quant::matvec(&w, xrow, &mut want, Precision::Fast);
        worst = worst.max(rel_err(&y[i * rows..][..rows], &want));
    }
    worst
}

/// The int8-activation (Q8_K) expert kernels of `Precision::Fast` vs the CPU's Fast dot products:
/// the activation quantization is bit-identical, the integer block dots are equal, so only the
/// order of the per-block float sums differs. Shared and per-slot activation rows, expert ids.
#[test]
fn fast_expert_matvec_matches_cpu_fast() {
    if !gpu_present() {
        return;
    }
    for ty in [GgmlType::Q2_K, GgmlType::IQ2_XXS] {
        for (rows, cols, z, per_slot) in [(2048usize, 4096usize, 6usize, false), (4096, 2048, 6, true), (40, 3072, 3, false), (13, 1024, 2, true), (7, 1024, 1, false)] {
            let data = ds4_quant::random_valid_blocks(ty, 31 + rows as u64, rows * cols / ty.block_elems() * z);
            let xr = if per_slot { z } else { 1 };
            let mut rng = ds4_quant::random::SplitMix64(rows as u64);
            let mut x: Vec<f32> = (0..xr * cols).map(|_| rng.normal()).collect();
            x[3] = 0.0;
            if cols >= 512 {
                // An all-zero block quantizes to zeros with scale 0.
                x[256..512].iter_mut().for_each(|v| *v = 0.0);
            }
            let (y, q, d) = ds4_cuda::matvec_fast_paths(ty, rows, cols, z, &data, &x).unwrap();
            let mut want_q = vec![0u8; xr * cols / 256 * 292];
            for (xrow, o) in x.chunks(cols).zip(want_q.chunks_mut(cols / 256 * 292)) {
                ds4_quant::quantize_row_q8_k(xrow, o);
            }
            for (b, blk) in want_q.chunks(292).enumerate() {
                assert_eq!(f32::from_le_bytes(blk[0..4].try_into().unwrap()).to_bits(), d[b].to_bits(), "Q8_K scale of block {b}");
                let got: Vec<u8> = q[b * 256..][..256].iter().map(|&v| v as u8).collect();
                assert_eq!(&blk[4..260], &got[..], "Q8_K values of block {b}");
            }
            let worst = worst_vs_cpu_fast(ty, rows, cols, z, per_slot, &data, &x, &y);
            println!("op fast {:<8} {rows}x{cols} z={z} per_slot={per_slot}: Q8_K activations identical, rel err vs CPU Fast {worst:.2e}", ty.name());
            assert!(worst < 1e-5, "fast {} rel err {worst}", ty.name());
        }
    }
}

/// The grouped expert GEMM reading IQ2_XXS / Q2_K blocks as stored gives bit-identical results to
/// dequantizing to f16 first (same f16 values, same kernel), and both are within f16 accuracy of the
/// CPU's f32 product; experts with 0, 1, 64, 100 and 150 tokens (tiles of up to 64, and of up to
/// 128: bit-identical to 64).
#[test]
fn grouped_expert_gemm_reads_quantized_blocks() {
    if !gpu_present() {
        return;
    }
    for (ty, rows, cols) in [(GgmlType::IQ2_XXS, 256usize, 1024usize), (GgmlType::Q2_K, 384, 512), (GgmlType::IQ2_XXS, 2048, 4096), (GgmlType::Q2_K, 4096, 2048)] {
        let counts = [100usize, 0, 1, 64, 17, 150];
        let total: usize = counts.iter().sum();
        let row_bytes = ty.row_bytes(cols).unwrap();
        let data = ds4_quant::random_valid_blocks(ty, 7 + cols as u64, rows * cols / ty.block_elems() * counts.len());
        let mut rng = ds4_quant::random::SplitMix64(rows as u64);
        let x: Vec<f32> = (0..total * cols).map(|_| rng.normal()).collect();
        let (direct, via_f16, tiles128) = ds4_cuda::grouped_gemm_paths(ty, rows, cols, &counts, &data, &x).unwrap();
        let mut want = vec![0f32; total * rows];
        let mut off = 0usize;
        for (e, &c) in counts.iter().enumerate() {
            if c > 0 {
                let w = MatRef::new(ty, &data[e * rows * row_bytes..][..rows * row_bytes], rows, cols).unwrap();
                matmul(&w, &x[off * cols..(off + c) * cols], c, &mut want[off * rows..(off + c) * rows], Precision::Exact);
            }
            off += c;
        }
        let e = rel_err(&direct, &want);
        println!("op grouped {:<8} {rows}x{cols} experts {counts:?}: direct == dequantized-first {}, rel err vs CPU {e:.2e}", ty.name(), direct == via_f16);
        assert!(direct == via_f16, "direct and dequantized-first grouped GEMMs differ");
        let differ = direct.iter().zip(&tiles128).filter(|(a, b)| a.to_bits() != b.to_bits()).count();
        assert_eq!(differ, 0, "128-token tiles differ from 64-token tiles");
        assert!(e < 3e-3, "grouped GEMM rel err {e}");
    }
}

/// The Q8_0-activation kernel of `Precision::Fast` vs the CPU's Fast Q8_0 dot: activations
/// identical (values and f16 scales), integer block dots equal, float sums in another order.
#[test]
fn fast_q8_0_matvec_matches_cpu_fast() {
    if !gpu_present() {
        return;
    }
    let ty = GgmlType::Q8_0;
    for (rows, cols, z, per_slot) in [(1024usize, 4096usize, 1usize, false), (4096, 8192, 1, false), (1024, 4096, 8, true), (37, 256, 3, false), (300, 1024, 2, true)] {
        let data = ds4_quant::random_valid_blocks(ty, 41 + rows as u64, rows * cols / 32 * z);
        let xr = if per_slot { z } else { 1 };
        let mut rng = ds4_quant::random::SplitMix64(3 + rows as u64);
        let mut x: Vec<f32> = (0..xr * cols).map(|_| rng.normal()).collect();
        x[32..64].iter_mut().for_each(|v| *v = 0.0);
        let (y, q, d) = ds4_cuda::matvec_fast_paths(ty, rows, cols, z, &data, &x).unwrap();
        let mut want_q = vec![0u8; xr * cols / 32 * 34];
        for (xrow, o) in x.chunks(cols).zip(want_q.chunks_mut(cols / 32 * 34)) {
            ds4_quant::quantize_row_q8_0(xrow, o);
        }
        for (b, blk) in want_q.chunks(34).enumerate() {
            let cd = ds4_quant::blocks::f16_at(blk, 0);
            assert_eq!(cd.to_bits(), d[b].to_bits(), "Q8_0 scale of block {b}");
            let got: Vec<u8> = q[b * 32..][..32].iter().map(|&v| v as u8).collect();
            assert_eq!(&blk[2..34], &got[..], "Q8_0 values of block {b}");
        }
        let worst = worst_vs_cpu_fast(ty, rows, cols, z, per_slot, &data, &x, &y);
        println!("op fast Q8_0 {rows}x{cols} z={z} per_slot={per_slot}: Q8_0 activations identical, rel err vs CPU Fast {worst:.2e}");
        assert!(worst < 1e-5, "fast Q8_0 rel err {worst}");
    }
}

/// Several activation rows through one split Q8_0 matrix in one launch (`mvq8_q8m_r2`: a verify
/// step's rows, a batch's sessions) give each row bit for bit what its own one-row product gives (same
/// K split), and are within the CPU Fast dot's rounding. Shapes cover every K split (1..8), rows not a
/// multiple of the task's, 2..8 rows, and the output head's width.
#[test]
fn shared_rows_q8_0_equal_one_row_products() {
    if !gpu_present() {
        return;
    }
    let ty = GgmlType::Q8_0;
    for (rows, cols, z) in [(1024usize, 4096usize, 2usize), (37, 256, 3), (4096, 1024, 8), (300, 2048, 5), (32768, 1024, 2), (129_280, 4096, 3)] {
        let data = ds4_quant::random_valid_blocks(ty, 5 + rows as u64, rows * cols / 32);
        let mut rng = ds4_quant::random::SplitMix64(9 + cols as u64);
        let x: Vec<f32> = (0..z * cols).map(|_| rng.normal()).collect();
        let (shared, one) = ds4_cuda::shared_rows_q8_0_paths(rows, cols, z, &data, &x).unwrap();
        let differ = shared.iter().zip(&one).filter(|(a, b)| a.to_bits() != b.to_bits()).count();
        let w = MatRef::new(ty, &data, rows, cols).unwrap();
        let mut worst = 0f64;
        for r in 0..z {
            let mut want = vec![0f32; rows];
            ds4_quant::matvec(&w, &x[r * cols..][..cols], &mut want, Precision::Fast);
            worst = worst.max(rel_err(&shared[r * rows..][..rows], &want));
        }
        println!("op shared rows Q8_0 {rows}x{cols} z={z}: {differ} of {} values differ from one-row products, rel err vs CPU Fast {worst:.2e}", z * rows);
        assert_eq!(differ, 0, "{rows}x{cols} z={z}");
        assert!(worst < 1e-5, "shared rows Q8_0 rel err {worst}");
    }
}

/// `Precision::Fast` on the GPU (int8 activations for split Q8_0 matrices and, where the shapes
/// allow, Q8_K for the experts) against the CPU's f32 reference, token by token (teacher-forced with
/// the reference's greedy tokens, one token per call so every product is a mat-vec): its error must
/// be no larger than the CPU's own Fast path shows against the same reference (the GPU quantizes a
/// subset of the activations the CPU Fast path does: tiny's 256-column IQ2_XXS experts stay f32).
#[test]
fn tiny_q2_fast_decode_error_within_cpu_fast_error() {
    if !gpu_present() {
        return;
    }
    let mut exact = load("tiny", Mix::Q2, 11, true);
    let mut fast = load_p("tiny", Mix::Q2, 11, true, Precision::Fast);
    let v = exact.stage.cfg.n_vocab as u32;
    let prompt: Vec<u32> = (0..40u32).map(|i| (i * 2654435761u32 >> 7) % v).collect();
    let ctx = 80;
    let mut gpu = ds4_cuda::CudaStage::new(&exact.stage, ctx, 1).unwrap();
    gpu.ops.fast_experts = true;
    gpu.ops.fast_q8 = true;
    let (mut ke, mut kf, mut kg) = (exact.stage.new_kv(ctx), fast.stage.new_kv(ctx), exact.stage.new_kv(ctx));
    let argmax = |l: &[f32]| l.iter().enumerate().fold((0usize, f32::NEG_INFINITY), |b, (i, &v)| if v > b.1 { (i, v) } else { b }).0 as u32;
    let (mut ec, mut eg) = (0f64, 0f64);
    let mut t = prompt[0];
    for i in 0..prompt.len() + 24 {
        let le = exact.stage.forward(&mut ke, &[t], None, Logits::Last).unwrap().to_vec();
        let lf = fast.stage.forward(&mut kf, &[t], None, Logits::Last).unwrap().to_vec();
        let lg = gpu.forward(&mut kg, &[t], None, Logits::Last).unwrap().to_vec();
        ec = ec.max(rel_err(&lf, &le));
        eg = eg.max(rel_err(&lg, &le));
        t = if i + 1 < prompt.len() { prompt[i + 1] } else { argmax(&le) };
    }
    println!("model tiny Q2 Fast, 64 one-token steps vs CPU Exact: GPU Fast worst logits rel err {eg:.2e}, CPU Fast {ec:.2e}");
    assert!(eg <= 1.5 * ec + 1e-5, "GPU Fast error {eg} above the CPU Fast error {ec}");
}

/// A context whose KV state cannot fit in the GPU's free memory is refused before anything large is
/// allocated, with the plan's numbers and the flags that help; so is a weight placement in host memory.
#[test]
fn stage_over_free_memory_is_refused_with_the_plan() {
    if !gpu_present() {
        return;
    }
    let m = load("tiny", Mix::Q2, 11, true);
    for place in [WeightPlace::Device, WeightPlace::Host] {
        let e = ds4_cuda::CudaStage::new_placed(&m.stage, 1 << 36, 16, place).err().expect("a 64 Gi-token context must not fit").to_string();
        println!("refusal ({place:?}): {e}");
        assert!(e.contains("GPU plan") && e.contains("KV") && e.contains("free before loading") && e.contains("--ctx"), "{e}");
    }
    // The GPU is still usable afterwards.
    assert!(ds4_cuda::CudaStage::new(&m.stage, 64, 16).is_ok());
}

/// `upload_kv` refuses a state that does not fit the stage (rows past its context) without breaking it:
/// a fresh sequence still runs, with the logits of a fresh stage.
#[test]
fn mismatched_kv_upload_is_refused_and_the_stage_recovers() {
    if !gpu_present() {
        return;
    }
    let mut m = load("tiny", Mix::Q2, 11, true);
    let prompt: Vec<u32> = (0..24).collect();
    let mut big = m.stage.new_kv(256);
    m.stage.forward(&mut big, &prompt, None, Logits::Last).unwrap();
    let mut gpu = ds4_cuda::CudaStage::new(&m.stage, 16, 32).unwrap();
    let e = gpu.upload_kv(&big).unwrap_err().to_string();
    println!("refusal: {e}");
    assert!(e.contains("context") || e.contains("room"), "{e}");
    let mut kv = m.stage.new_kv(16);
    let got = gpu.forward(&mut kv, &prompt[..8], None, Logits::Last).unwrap().to_vec();
    let mut fresh = ds4_cuda::CudaStage::new(&m.stage, 16, 32).unwrap();
    let mut kv2 = m.stage.new_kv(16);
    let want = fresh.forward(&mut kv2, &prompt[..8], None, Logits::Last).unwrap().to_vec();
    assert!(got == want, "logits after a refused upload differ from a fresh stage's");
}

/// A stage built on one thread runs on another (the server builds the engine, then moves it to its
/// worker thread): same logits.
#[test]
fn stage_moves_to_another_thread() {
    if !gpu_present() {
        return;
    }
    let m = load("tiny", Mix::Q2, 11, true);
    let ctx = 64;
    let mut gpu = ds4_cuda::CudaStage::new(&m.stage, ctx, 16).unwrap();
    let prompt: Vec<u32> = (0..16).collect();
    let mut kv = m.stage.new_kv(ctx);
    let want = gpu.forward(&mut kv, &prompt, None, Logits::Last).unwrap().to_vec();
    let mut kv2 = m.stage.new_kv(ctx);
    let got = std::thread::spawn(move || gpu.forward(&mut kv2, &prompt, None, Logits::Last).unwrap().to_vec()).join().unwrap();
    assert!(got == want, "logits differ after moving the stage to another thread");
}

/// The prefill's f16 products (dequantize, then the grouped expert kernel `moe_gemm` or one cuBLAS
/// GEMM per expert on the side streams; cuBLAS for the other matrices) stay within f16 accuracy of the
/// CPU's f32 reference over a whole prompt. The FP8/FP4 simulation is off: its rounding steps would
/// turn f16-sized differences into whole quantization steps (see the flash4 tests).
#[test]
fn prefill_f16_paths_match_cpu() {
    if !gpu_present() {
        return;
    }
    let mut m = load("tiny", Mix::Q2, 11, false);
    let (ctx, n) = (160usize, 120usize);
    let v = m.stage.cfg.n_vocab as u32;
    let prompt: Vec<u32> = (0..n as u32).map(|i| (i * 2654435761u32 >> 7) % v).collect();
    let mut kc = m.stage.new_kv(ctx);
    let want = m.stage.forward(&mut kc, &prompt, None, Logits::Last).unwrap().to_vec();
    let mut outs = Vec::new();
    for grouped in [true, false] {
        let mut gpu = ds4_cuda::CudaStage::new(&m.stage, ctx, n).unwrap();
        gpu.ops.grouped_gemm = grouped;
        let mut kg = m.stage.new_kv(ctx);
        let got = gpu.forward(&mut kg, &prompt, None, Logits::Last).unwrap().to_vec();
        println!("prefill {n} tokens on the f16 GEMM path (grouped expert kernel {grouped}): logits rel err vs CPU {:.2e}", rel_err(&got, &want));
        outs.push(got);
    }
    let e = rel_err(&outs[0], &outs[1]);
    println!("prefill: grouped kernel vs per-expert cuBLAS rel err {e:.2e}");
    for o in &outs {
        let e = rel_err(o, &want);
        assert!(e < 1e-2, "prefill logits rel err {e}");
    }
    assert!(e < 5e-3, "grouped vs per-expert rel err {e}");
}

/// CPU reference of prefill attention with sinks (f64): softmax over the window rows and the
/// compressed rows (or the selected ones), the sink in the denominator, inverse rope on the tail.
fn attention_reference(c: &ds4_cuda::AttnCase) -> Vec<f32> {
    let (d, half) = (c.d, c.freqs.len());
    let mut out = vec![0f32; c.n * c.nh * d];
    for i in 0..c.n {
        let pos = c.pos0 + i;
        let lo = (pos + 1).saturating_sub(c.swa);
        let mut rows: Vec<&[f32]> = (lo..=pos).map(|p| if p >= c.pos0 { &c.kvb[(p - c.pos0) * d..][..d] } else { &c.ring[(p % c.swa) * d..][..d] }).collect();
        let nc = if c.ratio > 0 { (pos + 1) / c.ratio } else { 0 };
        match c.sel {
            Some(s) if nc > c.topk => rows.extend(s[i * c.topk..][..c.topk].iter().map(|&r| &c.comp[r as usize * d..][..d])),
            _ => rows.extend((0..nc).map(|r| &c.comp[r * d..][..d])),
        }
        for h in 0..c.nh {
            let qv = &c.q[(i * c.nh + h) * d..][..d];
            let sc: Vec<f64> = rows.iter().map(|r| r.iter().zip(qv).map(|(a, b)| *a as f64 * *b as f64).sum::<f64>() / (d as f64).sqrt()).collect();
            let sink = c.sinks[h] as f64;
            let mx = sc.iter().fold(sink, |m, &v| m.max(v));
            let den: f64 = sc.iter().map(|v| (v - mx).exp()).sum::<f64>() + (sink - mx).exp();
            let mut acc = vec![0f64; d];
            for (r, s) in rows.iter().zip(&sc) {
                let p = (s - mx).exp() / den;
                for k in 0..d {
                    acc[k] += p * r[k] as f64;
                }
            }
            let tail0 = d - 2 * half;
            for kk in 0..half {
                let (sn, cs) = (pos as f64 * c.freqs[kk]).sin_cos();
                let (x0, x1) = (acc[tail0 + 2 * kk], acc[tail0 + 2 * kk + 1]);
                acc[tail0 + 2 * kk] = x0 * cs + x1 * sn;
                acc[tail0 + 2 * kk + 1] = -x0 * sn + x1 * cs;
            }
            for k in 0..d {
                out[(i * c.nh + h) * d + k] = acc[k] as f32;
            }
        }
    }
    out
}

/// Tensor-core prefill attention (f16 operands, f32 accumulation) and the f32 kernel vs the f64 CPU
/// reference: window rows from the batch and the ring, all compressed rows, and an indexer selection.
#[test]
fn prefill_attention_kernels_match_reference() {
    if !gpu_present() {
        return;
    }
    let (d, nh, swa, half) = (512usize, 64usize, 128usize, 32usize);
    let mut rng = ds4_quant::random::SplitMix64(5);
    let mut v = |n: usize, s: f32| -> Vec<f32> { (0..n).map(|_| rng.normal() * s).collect() };
    for (n, pos0, ratio, topk, with_sel) in [(37usize, 0usize, 4usize, 0usize, false), (70, 200, 128, 0, false), (45, 300, 4, 24, true)] {
        let ncomp = (pos0 + n) / ratio + 1;
        let q = v(n * nh * d, 1.5);
        let kvb = v(n * d, 1.0);
        let ring = v(swa * d, 1.0);
        let comp = v(ncomp * d, 1.0);
        let sinks = v(nh, 1.0);
        let freqs: Vec<f64> = (0..half).map(|k| 1.0 / 10000f64.powf(2.0 * k as f64 / (2 * half) as f64)).collect();
        let sel: Vec<i32> = (0..n * topk.max(1)).map(|j| ((j * 7919) % ncomp.min((pos0 + 1) / ratio).max(1)) as i32).collect();
        let c = ds4_cuda::AttnCase {
            n, nh, d, pos0, swa, ratio, topk, q: &q, kvb: &kvb, ring: &ring, comp: &comp, sel: if with_sel { Some(&sel) } else { None }, sinks: &sinks, freqs: &freqs,
        };
        let want = attention_reference(&c);
        for tc in [64usize, 32] {
            let (f32k, tck) = ds4_cuda::attention_paths(&c, tc).unwrap();
            let (e1, e2) = (rel_err(&f32k, &want), rel_err(&tck, &want));
            println!("op attention n={n} pos0={pos0} ratio={ratio} sel={with_sel}: f32 kernel rel err {e1:.2e}, tensor cores ({tc} heads/block) rel err {e2:.2e}");
            assert!(e1 < 1e-5, "f32 attention rel err {e1}");
            assert!(e2 < 3e-3, "tensor-core attention rel err {e2}");
        }
    }
}

/// The query's per-head RMS norm (no weight) and rope at `pos`, in f64, as crates/model applies them
/// before attention (rms_norm, then Rope::apply); rounded to f32 once at the end.
fn q_norm_rope(q: &[f32], d: usize, freqs: &[f64], pos: usize, eps: f32) -> Vec<f32> {
    let t0 = d - 2 * freqs.len();
    q.chunks(d)
        .flat_map(|h| {
            let ss: f64 = h.iter().map(|&v| v as f64 * v as f64).sum();
            let inv = 1.0 / (ss / d as f64 + eps as f64).sqrt();
            let mut x: Vec<f64> = h.iter().map(|&v| v as f64 * inv).collect();
            for (k, f) in freqs.iter().enumerate() {
                let (s, c) = (pos as f64 * f).sin_cos();
                let (x0, x1) = (x[t0 + 2 * k], x[t0 + 2 * k + 1]);
                x[t0 + 2 * k] = x0 * c - x1 * s;
                x[t0 + 2 * k + 1] = x0 * s + x1 * c;
            }
            x.into_iter().map(|v| v as f32)
        })
        .collect()
}

/// One-token decode attention as the stage launches it (raw query in: the per-head norm and rope are
/// folded into attn_dec; candidates in chunks of 16 merged with the sink; ring store; Q8_0 copy of the
/// output) vs the f64 CPU reference: indexer selection, all compressed rows, ratio 128 (also with more
/// chunks than the grid has blocks), a window not yet full, the tiny shape and wide heads. The bound
/// is the f32 prefill kernel's (1e-5): 512-term f32 dots carry ~1e-6 relative error into scores of
/// size ~5, the exponentials and the positive-weighted sums add ~1e-7 per step.
#[test]
fn decode_attention_matches_reference() {
    if !gpu_present() {
        return;
    }
    let eps = 1e-6f32;
    let mut rng = ds4_quant::random::SplitMix64(17);
    let mut pick = ds4_quant::random::SplitMix64(23);
    // (heads, head dim, rope pairs, window, ratio, top-k, selection, position)
    let cases = [
        (64usize, 512usize, 32usize, 128usize, 4usize, 512usize, true, 2600usize),
        (64, 512, 32, 128, 4, 512, true, 400),
        (64, 512, 32, 128, 128, 0, false, 5000),
        (64, 512, 32, 128, 128, 0, false, 150_000),
        (64, 512, 32, 128, 0, 0, false, 60),
        (4, 128, 32, 32, 4, 8, true, 100),
        (12, 1024, 32, 128, 128, 0, false, 700),
    ];
    for (nh, d, half, swa, ratio, topk, with_sel, pos) in cases {
        let mut v = |n: usize, s: f32| -> Vec<f32> { (0..n).map(|_| rng.normal() * s).collect() };
        let nc = (pos + 1).checked_div(ratio).unwrap_or(0);
        let (q, kvb, ring, comp, sinks) = (v(nh * d, 3.0), v(d, 1.5), v(swa * d, 1.5), v(nc.max(1) * d, 1.5), v(nh, 1.0));
        let freqs: Vec<f64> = (0..half).map(|k| 1.0 / 10000f64.powf(2.0 * k as f64 / (2 * half) as f64)).collect();
        // A selection as idx_topk leaves it: distinct rows in ascending order.
        let mut rows: Vec<i32> = (0..nc.max(topk).max(1) as i32).collect();
        for i in (1..rows.len()).rev() {
            rows.swap(i, (pick.next_u64() % (i as u64 + 1)) as usize);
        }
        let mut sel: Vec<i32> = rows[..topk.max(1)].iter().map(|&r| r % nc.max(1) as i32).collect();
        sel.sort_unstable();
        let sel_used = with_sel && nc > topk;
        let ncand = (pos + 1).min(swa) + if sel_used { topk } else { nc };
        let raw = ds4_cuda::AttnCase {
            n: 1, nh, d, pos0: pos, swa, ratio, topk, q: &q, kvb: &kvb, ring: &ring, comp: &comp, sel: if with_sel { Some(&sel) } else { None }, sinks: &sinks, freqs: &freqs,
        };
        let qn = q_norm_rope(&q, d, &freqs, pos, eps);
        let want = attention_reference(&ds4_cuda::AttnCase { q: &qn, ..raw });
        // The grid and partials sized for more candidates than this position has (chunks past them are skipped).
        let got = ds4_cuda::decode_attention_path(&raw, eps, ncand + 40).unwrap();
        let e = rel_err(&got.o, &want);
        println!("op decode attention nh={nh} d={d} pos={pos} ratio={ratio} sel={sel_used}: {ncand} candidates, rel err {e:.2e}, repeat identical {}", got.repeat_identical);
        assert!(e < 1e-5, "decode attention rel err {e}");
        assert!(got.repeat_identical, "decode attention differs between two calls");
        let mut ring_want = ring.clone();
        ring_want[(pos % swa) * d..][..d].copy_from_slice(&kvb);
        assert!(got.ring == ring_want, "ring after the merge: this token's row at slot pos % swa, nothing else");
        let mut blocks = vec![0u8; nh * d / 32 * 34];
        ds4_quant::quantize_row_q8_0(&got.o, &mut blocks);
        for (b, blk) in blocks.chunks(34).enumerate() {
            assert_eq!(ds4_quant::blocks::f16_at(blk, 0).to_bits(), got.d80[b].to_bits(), "Q8_0 scale of block {b}");
            let qv: Vec<u8> = got.q80[b * 32..][..32].iter().map(|&x| x as u8).collect();
            assert_eq!(&blk[2..34], &qv[..], "Q8_0 values of block {b}");
        }
    }
}

/// Indexer scores, f32 kernel and tensor cores (f16 operands), vs an f64 CPU reference.
#[test]
fn indexer_score_kernels_match_reference() {
    if !gpu_present() {
        return;
    }
    let (h, d, ratio, topk, pos0, n) = (64usize, 128usize, 4usize, 16usize, 100usize, 50usize);
    let nrows = (pos0 + n) / ratio;
    let mut rng = ds4_quant::random::SplitMix64(9);
    let mut v = |k: usize, s: f32| -> Vec<f32> { (0..k).map(|_| rng.normal() * s).collect() };
    let (q, wts, keys) = (v(n * h * d, 1.0), v(n * h, 0.3), v(nrows * d, 1.0));
    let mut want = vec![0f32; n * nrows];
    for i in 0..n {
        let nc = (pos0 + i + 1) / ratio;
        if nc <= topk {
            continue;
        }
        for c in 0..nc {
            let mut s = 0f64;
            for hh in 0..h {
                let dot: f64 = (0..d).map(|k| q[(i * h + hh) * d + k] as f64 * keys[c * d + k] as f64).sum();
                s += wts[i * h + hh] as f64 * dot.max(0.0);
            }
            want[i * nrows + c] = s as f32;
        }
    }
    let (f32k, tck) = ds4_cuda::indexer_paths(&q, &wts, &keys, n, pos0, ratio, topk).unwrap();
    let (e1, e2) = (rel_err(&f32k, &want), rel_err(&tck, &want));
    println!("op indexer scores n={n} rows={nrows}: f32 kernel rel err {e1:.2e}, tensor cores rel err {e2:.2e}");
    assert!(e1 < 1e-5, "f32 indexer rel err {e1}");
    assert!(e2 < 3e-3, "tensor-core indexer rel err {e2}");
}

#[test]
fn producer_int8_copies_equal_standalone_quantization() {
    if !gpu_present() {
        return;
    }
    // Flash sizes: 4096 embedding, 4 streams, 2048 expert width, 6 experts.
    let checks = ds4_cuda::act_copy_checks(21, 4096, 4, 2048, 6).unwrap();
    for c in &checks {
        println!("op {}: {} values, {} differ from the stand-alone quantization; f32 output rel err {:.2e}", c.what, c.values, c.mismatches, c.rel_err);
    }
    for c in &checks {
        assert_eq!(c.mismatches, 0, "{}", c.what);
        // The fused entry sums the mix projection in another order than the mat-vec kernel.
        assert!(c.rel_err < 1e-5, "{}: rel err {}", c.what, c.rel_err);
    }
}

#[test]
fn fused_decode_router_matches_matvec_and_route() {
    if !gpu_present() {
        return;
    }
    for (seed, e, ne, k) in [(3u64, 4096usize, 256usize, 6usize), (4, 256, 8, 2), (5, 4096, 256, 6)] {
        let (same, wd, lerr, rows_same) = ds4_cuda::router_check(seed, e, ne, k).unwrap();
        println!("op router e={e} ne={ne} k={k}: same experts {same}, weights rel diff {wd:.2e}, logits rel err {lerr:.2e}, 3 rows as 1 {rows_same}");
        assert!(same, "fused router chose other experts");
        assert!(rows_same, "a row of a 3-row launch routed otherwise than alone");
        // Other summation order of the gate logits: the weights differ by float rounding only.
        assert!(wd < 1e-5 && lerr < 1e-5, "weights {wd}, logits {lerr}");
    }
}

/// The pinned staging path of a distributed stage's hidden rows: sizes under, at and over one slice,
/// an odd tail, several slices with both buffers reused, and a second pass over the same buffers; every
/// byte comes back both ways (up staged / down plain, up plain / down staged).
#[test]
fn staged_copies_round_trip() {
    if !gpu_present() {
        return;
    }
    let slice = 4 << 20;
    let sizes = [1usize, 4095, slice, slice + 1, 3 * slice + 12345, 5 * slice];
    let ok = ds4_cuda::staging_round_trips(&sizes, slice).unwrap();
    println!("op staging round trips (slice {slice} B, sizes {sizes:?}, 2 passes): {ok:?}");
    assert!(ok.iter().all(|&b| b), "a staged copy lost bytes: {ok:?}");
}

/// The greedy kernel: argmax with ties to the lowest index, NaN never chosen, and the log-softmax of
/// the pick (f64 host reference) on a Flash-size vocabulary row and on edge rows; repeated launches
/// reuse the buffer (the completion ticket resets itself).
#[test]
fn greedy_kernel_picks_the_argmax_and_its_log_probability() {
    if !gpu_present() {
        return;
    }
    let reference = |x: &[f32]| {
        let mut b = 0usize;
        for (i, &v) in x.iter().enumerate() {
            if v > x[b] || x[b].is_nan() && !v.is_nan() {
                b = i;
            }
        }
        let m = x[b] as f64;
        let s: f64 = x.iter().filter(|v| !v.is_nan() && **v > f32::NEG_INFINITY).map(|&v| (v as f64 - m).exp()).sum();
        (b as u32, -s.ln())
    };
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut rnd = || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed >> 40) as f32 / (1u64 << 24) as f32
    };
    let big: Vec<f32> = (0..129_280).map(|_| rnd() * 30.0 - 15.0).collect();
    let mut ties = vec![0.5f32; 1000];
    ties[700] = 2.0;
    ties[300] = 2.0;
    ties[10] = f32::NAN;
    ties[11] = f32::NEG_INFINITY;
    let mut flat = vec![-3.0f32; 129_280];
    flat[129_279] = -2.0;
    for (name, row) in [("random 129280", &big), ("ties, NaN, -inf", &ties), ("peak at the end", &flat)] {
        let (id, lp) = reference(row);
        for blocks in [1u32, 128] {
            for (k, (gid, glp)) in ds4_cuda::greedy_row(row, blocks, 3).unwrap().into_iter().enumerate() {
                assert_eq!(gid, id, "{name}: index, {blocks} blocks, launch {k}");
                assert!((glp as f64 - lp).abs() <= 1e-5 * lp.abs().max(1.0), "{name}: log-probability {glp} vs {lp}, {blocks} blocks, launch {k}");
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Batched decode of several sessions (KV slots): the batch schedule of the wgpu test, on CUDA.
// ---------------------------------------------------------------------------------------------

fn argmax_row(l: &[f32]) -> u32 { l.iter().enumerate().fold((0usize, f32::NEG_INFINITY), |b, (i, &v)| if v > b.1 { (i, v) } else { b }).0 as u32 }

/// Four sessions (prompts of `lens`), `steps` batched steps; session 3 joins (is prefilled in its slot)
/// before step `JOIN`, session 1 leaves after step `LEAVE`; odd steps list the rows in reverse slot
/// order (row index ≠ slot).
const JOIN: usize = 5;
const LEAVE: usize = 9;
fn takes(i: usize, step: usize) -> bool { (i != 3 || step >= JOIN) && (i != 1 || step <= LEAVE) }

/// Logits rows of each session (after its prompt, then after each of its decode steps) decoded alone
/// on a one-slot stage, greedy; and the rows of the same sessions decoded in batches on a four-slot
/// stage (`rowwise`: exact rows, else the multi-token kernels), fed the alone run's tokens (so a row that picks another
/// token does not change what later rows are compared against).
struct BatchRun {
    alone: Vec<Vec<Vec<f32>>>,
    batched: Vec<Vec<Vec<f32>>>,
}

fn batch_run(m: &Model, lens: &[usize; 4], chunk: usize, steps: usize, rowwise: bool) -> BatchRun {
    let v = m.stage.cfg.n_vocab;
    let ctx = lens.iter().max().unwrap() + steps + 8;
    let prompts: Vec<Vec<u32>> = lens.iter().enumerate().map(|(i, &n)| (0..n as u32).map(|k| ((k + 97 * i as u32) * 2654435761u32 >> 7) % v as u32).collect()).collect();
    let counts: Vec<usize> = (0..4).map(|i| (0..steps).filter(|&s| takes(i, s)).count()).collect();
    // Alone: a plain stage (one KV slot, decode graphs).
    let mut alone = Vec::new();
    let mut fed: Vec<Vec<u32>> = Vec::new();
    {
        let mut gpu = ds4_cuda::CudaStage::new(&m.stage, ctx, chunk).unwrap();
        for (p, &count) in prompts.iter().zip(&counts) {
            let mut kv = m.stage.new_kv(ctx);
            let mut rows = Vec::new();
            for c in p.chunks(chunk) {
                rows = vec![gpu.forward(&mut kv, c, None, Logits::Last).unwrap().to_vec()];
            }
            let mut toks = Vec::new();
            for _ in 0..count {
                let t = argmax_row(rows.last().unwrap());
                toks.push(t);
                rows.push(gpu.forward(&mut kv, &[t], None, Logits::Last).unwrap().to_vec());
            }
            alone.push(rows);
            fed.push(toks);
        }
    }
    // Batched: session i in KV slot i.
    let mut gpu = ds4_cuda::CudaStage::new_slots(&m.stage, ctx, chunk, m.stage.w.range, 0, WeightPlace::Device, 4).unwrap();
    assert_eq!(gpu.slots(), 4);
    // Not rowwise: every batch through the multi-token kernels (by default batches of up to
    // EXACT_BATCH_ROWS sessions take exact rows too).
    if rowwise {
        gpu.ops.set_exact_batches(true);
    } else {
        gpu.ops.set_exact_batch_rows(0);
    }
    let mut kvs: Vec<ds4_model::KvState> = (0..4)
        .map(|i| {
            let mut kv = m.stage.new_kv(ctx);
            kv.slot = i;
            kv
        })
        .collect();
    let mut batched: Vec<Vec<Vec<f32>>> = vec![Vec::new(); 4];
    let prefill = |gpu: &mut ds4_cuda::CudaStage, kv: &mut ds4_model::KvState, p: &[u32]| -> Vec<f32> {
        let mut last = Vec::new();
        for c in p.chunks(chunk) {
            last = gpu.forward(kv, c, None, Logits::Last).unwrap().to_vec();
        }
        last
    };
    for i in 0..3 {
        batched[i].push(prefill(&mut gpu, &mut kvs[i], &prompts[i]));
    }
    for step in 0..steps {
        if step == JOIN {
            batched[3].push(prefill(&mut gpu, &mut kvs[3], &prompts[3]));
        }
        let mut active: Vec<usize> = (0..4).filter(|&i| takes(i, step)).collect();
        if step % 2 == 1 {
            active.reverse();
        }
        let toks: Vec<u32> = active.iter().map(|&i| fed[i][batched[i].len() - 1]).collect();
        let mut refs: Vec<&mut ds4_model::KvState> = Vec::new();
        let mut rest: Vec<Option<&mut ds4_model::KvState>> = kvs.iter_mut().map(Some).collect();
        for &i in &active {
            refs.push(rest[i].take().unwrap());
        }
        let rows = gpu.forward_batch(&mut refs, &toks).unwrap().to_vec();
        assert_eq!(rows.len(), active.len() * v);
        for (j, &i) in active.iter().enumerate() {
            batched[i].push(rows[j * v..(j + 1) * v].to_vec());
        }
    }
    for i in 0..4 {
        assert_eq!(batched[i].len(), alone[i].len(), "session {i}: rows");
        assert_eq!(kvs[i].pos, lens[i] + counts[i], "session {i}: position");
    }
    // Not vacuous: the sessions' greedy streams differ from each other.
    let firsts: std::collections::HashSet<u32> = alone.iter().map(|a| argmax_row(&a[0])).collect();
    assert!(firsts.len() > 1, "degenerate model: every session picks the same token");
    BatchRun { alone, batched }
}

/// Deterministic mode (exact batches, `--deterministic`): each batch row is computed as a one-token
/// decode step of its session computes it (exact_rows.rs), so every row's logits are bit-identical to
/// the session decoded alone, and its greedy tokens equal — through a session joining mid-stream, one
/// leaving, and rows listed out of slot order.
fn deterministic_batch_case(mix: Mix) {
    if !gpu_present() {
        return;
    }
    let m = load("tiny", mix, 11, true);
    let r = batch_run(&m, &[5, 17, 30, 41], 8, 16, true);
    for i in 0..4 {
        for (k, (b, a)) in r.batched[i].iter().zip(&r.alone[i]).enumerate() {
            assert_eq!(argmax_row(b), argmax_row(a), "session {i} row {k}: greedy token");
            assert!(b.iter().zip(a).all(|(x, y)| x.to_bits() == y.to_bits()), "session {i} row {k}: logits differ from decoding alone (rel err {:.2e})", rel_err(b, a));
        }
    }
    println!("model tiny {mix:?}: deterministic batches of up to 4 sessions, 16 steps: every row bit-identical to decoding alone");
}

#[test]
fn batch_deterministic_tiny_q2_equals_alone_bitwise() { deterministic_batch_case(Mix::Q2); }

#[test]
fn batch_deterministic_tiny_q4_equals_alone_bitwise() { deterministic_batch_case(Mix::Q4); }

/// Default batched mode: the row-independent products of a batch run on all rows at once (the
/// multi-token kernels, as a prefill chunk's), the per-sequence ops row by row. Rows then differ from
/// decoding alone only by the f32 summation order of the products (Precision::Exact, fewer rows than
/// the GEMM threshold), turned into occasional whole FP8/FP4 steps by the QAT simulation: the nature of
/// the GPU decode's difference from the CPU reference, which `model_case` holds to a logits relative
/// error of 2e-2 over 64 steps with every greedy token equal on these models. The same bound applies
/// here; the prefill rows (same kernels in another slot) must be bit-identical, and every greedy token
/// of the first 4 batched steps equal. Prints the agreement rate and the worst error.
fn default_batch_case(mix: Mix) {
    if !gpu_present() {
        return;
    }
    let m = load("tiny", mix, 11, true);
    let r = batch_run(&m, &[5, 17, 30, 41], 8, 16, false);
    let (mut same, mut total, mut worst) = (0usize, 0usize, 0f64);
    for i in 0..4 {
        let (b0, a0) = (&r.batched[i][0], &r.alone[i][0]);
        assert!(b0.iter().zip(a0).all(|(x, y)| x.to_bits() == y.to_bits()), "session {i}: prefill in slot {i} differs from slot 0's");
        for (k, (b, a)) in r.batched[i].iter().zip(&r.alone[i]).enumerate().skip(1) {
            let e = rel_err(b, a);
            worst = worst.max(e);
            let eq = argmax_row(b) == argmax_row(a);
            same += eq as usize;
            total += 1;
            if k <= 4 {
                assert!(eq, "session {i} batched step {k}: greedy token differs from decoding alone (logits rel err {e:.2e})");
            }
        }
    }
    println!("model tiny {mix:?}: default batches of up to 4 sessions, 16 steps: {same}/{total} rows pick the token of decoding alone; worst logits rel err {worst:.2e}");
    assert!(worst < 2e-2, "batched logits rel err {worst} vs decoding alone");
}

#[test]
fn batch_default_tiny_q2_close_to_alone() { default_batch_case(Mix::Q2); }

#[test]
fn batch_default_tiny_q4_close_to_alone() { default_batch_case(Mix::Q4); }

fn first_two(kvs: &mut [ds4_model::KvState]) -> [&mut ds4_model::KvState; 2] {
    let (a, b) = kvs.split_at_mut(1);
    [&mut a[0], &mut b[0]]
}

/// Bad batches are typed errors, not panics, and leave the stage usable: more sessions than slots, a
/// slot out of range (in a batch and in a single forward), a slot twice, more slots than activation
/// rows, and a slot count whose KV does not fit (refused with the plan, naming the flag).
#[test]
fn batch_bad_input_is_refused() {
    if !gpu_present() {
        return;
    }
    let m = load("tiny", Mix::Q2, 11, true);
    let ctx = 64;
    let r = m.stage.w.range;
    let e = ds4_cuda::CudaStage::new_slots(&m.stage, ctx, 2, r, 0, WeightPlace::Device, 4).err().expect("4 slots with 2 activation rows").to_string();
    assert!(e.contains("4 KV slots") && e.contains("--prefill-chunk"), "{e}");
    let e = ds4_cuda::CudaStage::new_slots(&m.stage, 1 << 24, 4096, r, 0, WeightPlace::Device, 4096).err().expect("4096 slots of a 16 Mi-token context must not fit").to_string();
    println!("refusal: {e}");
    assert!(e.contains("GPU plan") && e.contains("--batched-session"), "{e}");

    let mut gpu = ds4_cuda::CudaStage::new_slots(&m.stage, ctx, 8, r, 0, WeightPlace::Device, 4).unwrap();
    let mut kvs: Vec<ds4_model::KvState> = (0..5)
        .map(|i| {
            let mut kv = m.stage.new_kv(ctx);
            kv.slot = i % 4;
            kv
        })
        .collect();
    let mut five: Vec<&mut ds4_model::KvState> = kvs.iter_mut().collect();
    let e = gpu.forward_batch(&mut five, &[1; 5]).err().map(|e| e.to_string()).unwrap_or_default();
    assert!(e.contains("exceeds the 4 KV slots"), "{e}");
    kvs[1].slot = 9;
    let e = gpu.forward_batch(&mut first_two(&mut kvs), &[1, 2]).err().map(|e| e.to_string()).unwrap_or_default();
    assert!(e.contains("KV slot 9"), "{e}");
    let e = gpu.forward(&mut kvs[1], &[1], None, Logits::Last).err().map(|e| e.to_string()).unwrap_or_default();
    assert!(e.contains("KV slot 9"), "{e}");
    kvs[1].slot = 0;
    let e = gpu.forward_batch(&mut first_two(&mut kvs), &[1, 2]).err().map(|e| e.to_string()).unwrap_or_default();
    assert!(e.contains("appears twice"), "{e}");
    // Still usable: a valid batch runs, and each row equals its session's single step (deterministic).
    gpu.ops.set_exact_batches(true);
    kvs[1].slot = 1;
    let rows = gpu.forward_batch(&mut first_two(&mut kvs), &[1, 2]).unwrap().to_vec();
    let mut fresh = ds4_cuda::CudaStage::new(&m.stage, ctx, 8).unwrap();
    let v = m.stage.cfg.n_vocab;
    for (j, t) in [1u32, 2].into_iter().enumerate() {
        let mut kv = m.stage.new_kv(ctx);
        let want = fresh.forward(&mut kv, &[t], None, Logits::Last).unwrap().to_vec();
        assert!(rows[j * v..(j + 1) * v] == want[..], "row {j} after refused batches differs from a fresh stage's step");
    }
}

/// Speculative verification on CUDA: a journaled step of 2..5 tokens (the current token and its
/// drafts) runs as exact rows, so every row's logits are those of decoding the tokens one by one, bit
/// for bit; a rollback past a rejected draft (the accepted tokens re-run as exact rows) leaves the
/// state decoding would have left (the next steps' logits are checked too). Prompt of 100 in chunks of
/// 32, then verify steps up to position 170: across the ratio-128 window end (127) and many ratio-4
/// ones, every draft length and every number of accepted drafts. Both precisions (the int8-activation
/// products of `Precision::Fast` and the f32 ones).
fn verify_case(shape: &str, mix: Mix, precision: Precision, end: usize) {
    if !gpu_present() {
        return;
    }
    let m = load_p(shape, mix, 13, true, precision);
    let (ctx, chunk, plen) = (end + 16, 32, 100);
    let v = m.stage.cfg.n_vocab;
    let prompt: Vec<u32> = (0..plen as u32).map(|k| (k * 2654435761u32 >> 9) % v as u32).collect();
    let prefill = |gpu: &mut ds4_cuda::CudaStage, kv: &mut ds4_model::KvState| -> Vec<f32> {
        let mut last = Vec::new();
        for c in prompt.chunks(chunk) {
            last = gpu.forward(kv, c, None, Logits::Last).unwrap().to_vec();
        }
        last
    };
    // Reference: greedy decode one token at a time; logits[i] follow token toks[i] at position plen + i.
    let (mut toks, mut logits) = (Vec::new(), Vec::new());
    {
        let mut gpu = ds4_cuda::CudaStage::new(&m.stage, ctx, chunk).unwrap();
        let mut kv = m.stage.new_kv(ctx);
        let mut l = prefill(&mut gpu, &mut kv);
        while kv.pos < end + 6 {
            let t = argmax_row(&l);
            l = gpu.forward(&mut kv, &[t], None, Logits::Last).unwrap().to_vec();
            toks.push(t);
            logits.push(l.clone());
        }
    }
    let bits = |a: &[f32], b: &[f32]| a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits());
    let mut gpu = ds4_cuda::CudaStage::new(&m.stage, ctx, chunk).unwrap();
    assert!(gpu.ops.verify_capable(), "this stage cannot verify as exact rows");
    let mut kv = m.stage.new_kv(ctx);
    prefill(&mut gpu, &mut kv);
    let (mut steps, mut rows_checked) = (0usize, 0usize);
    while kv.pos < end {
        let i = kv.pos - plen;
        let len = 2 + steps % 4;
        gpu.begin_journal(&kv).unwrap();
        if steps % 2 == 1 {
            // Greedy verification: each row's pick made on the device, the rows' logits left there.
            let picks = gpu.forward_picks(&mut kv, &toks[i..i + len]).unwrap().to_vec();
            assert_eq!(picks.len(), len);
            for r in 0..len {
                let want = &logits[i + r];
                assert_eq!(picks[r].0, argmax_row(want), "{shape} {mix:?} {precision:?}: device pick of verify row {r} at {}", plen + i);
                let got = gpu.logits_row(r).unwrap();
                assert!(bits(got, want), "{shape} {mix:?} {precision:?}: verify step at {} row {r} of {len} (picked) differs from decoding (rel err {:.2e})", plen + i, rel_err(got, want));
            }
        } else {
            let rows = gpu.forward(&mut kv, &toks[i..i + len], None, Logits::All).unwrap().to_vec();
            assert_eq!(rows.len(), len * v);
            for r in 0..len {
                let (got, want) = (&rows[r * v..(r + 1) * v], &logits[i + r]);
                assert!(bits(got, want), "{shape} {mix:?} {precision:?}: verify step at {} row {r} of {len} differs from decoding (rel err {:.2e})", plen + i, rel_err(got, want));
            }
        }
        rows_checked += len;
        // Accept 0 ..= len - 1 drafts in turn (all of them every fourth step).
        let keep = 1 + (steps * 7 + 3) % len;
        gpu.rollback(&mut kv, plen + i + keep).unwrap();
        gpu.end_journal();
        assert_eq!(kv.pos, plen + i + keep);
        steps += 1;
    }
    // The state after the last rollback is decoding's: plain steps go on bit for bit.
    for _ in 0..3 {
        let i = kv.pos - plen;
        let got = gpu.forward(&mut kv, &toks[i..i + 1], None, Logits::Last).unwrap().to_vec();
        assert!(bits(&got, &logits[i]), "{shape} {mix:?} {precision:?}: decode at {} after verify steps differs (rel err {:.2e})", plen + i, rel_err(&got, &logits[i]));
    }
    println!("model {shape} {mix:?} {precision:?}: {steps} verify steps ({rows_checked} rows) from {plen} to {end}: every row and the decode after them bit-identical to decoding");
}

#[test]
fn verify_rows_tiny_q2_equal_decode_bitwise() {
    verify_case("tiny", Mix::Q2, Precision::Fast, 170);
    verify_case("tiny", Mix::Q2, Precision::Exact, 170);
}

#[test]
fn verify_rows_tiny_q4_equal_decode_bitwise() {
    verify_case("tiny", Mix::Q4, Precision::Fast, 170);
    verify_case("tiny", Mix::Q4, Precision::Exact, 170);
}

#[test]
#[ignore = "flash-shaped: ~10 GB synthetic file; run on the device with --ignored"]
fn verify_rows_flash4_q2_equal_decode_bitwise() { verify_case("flash:4", Mix::Q2, Precision::Fast, 140); }

/// A stage built for "the largest prefill chunk that fits" (`--prefill-chunk` not given) holds all of
/// its largest candidate when the GPU has room, runs a step of that many tokens, and gives logits
/// bit-identical to a stage built for that chunk; a reserve of the whole GPU leaves the minimum.
#[test]
fn stage_takes_the_largest_prefill_chunk_that_fits() {
    if !gpu_present() {
        return;
    }
    let m = load("tiny", Mix::Q2, 5, true);
    let ctx = 1024;
    let auto = ds4_model::memplan::ChunkFit::gpu_auto(ctx, 256);
    let mut g = ds4_cuda::CudaStage::new_fitting(&m.stage, ctx, auto, m.stage.w.range, 0, WeightPlace::Device, 1).unwrap();
    assert_eq!(g.rows(), 1024);
    let v = m.stage.cfg.n_vocab as u32;
    let prompt: Vec<u32> = (0..1000u32).map(|i| (i * 2654435761u32 >> 7) % v).collect();
    let mut kv = m.stage.new_kv(ctx);
    let a = g.forward(&mut kv, &prompt, None, Logits::Last).unwrap().to_vec();
    let mut fixed = ds4_cuda::CudaStage::new(&m.stage, ctx, 1024).unwrap();
    let mut kv = m.stage.new_kv(ctx);
    let b = fixed.forward(&mut kv, &prompt, None, Logits::Last).unwrap().to_vec();
    assert_eq!(a, b);
    let total = cudarc::driver::result::mem_get_info().unwrap().1 as u64;
    drop((g, fixed));
    let g = ds4_cuda::CudaStage::new_fitting(&m.stage, ctx, ds4_model::memplan::ChunkFit { reserve: total, ..auto }, m.stage.w.range, 0, WeightPlace::Device, 1).unwrap();
    assert_eq!(g.rows(), 256, "a reserve of the whole GPU leaves the minimum");
}
