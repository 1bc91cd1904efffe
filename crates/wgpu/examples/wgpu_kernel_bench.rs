//! Times the decode step's kernels one by one at the Flash shapes on the chosen adapter: the cost of a
//! dispatch alone (a product of 8 rows), every Q8_0 mat-vec of a layer and the output head, the routed
//! experts (6 of 256, IQ2_XXS gate and Q2_K down) and the attention of one query at position 4096 (ratio
//! 0, 4 with the indexer's 512 picks, 128). Weights rotate over enough copies that a run reads more than
//! the GPU's caches hold; each line is the best of 3 submits of `ITERS` dispatches (wall clock after a
//! wait, less the host's recording time), as µs per dispatch and GB/s of weights read (`bench/wgpu/kernels.sh` runs it).
//!
//! `--sweep` also times each Q8_0 product under every workgroup shape (`shaders::matvec_shapes`), for
//! tuning `shaders::matvec_shape`.
//!
//! cargo run --release -p ds4-wgpu --example wgpu_kernel_bench -- [ITERS] [--checked] [--sweep] [--adapter NAME]
use std::time::Instant;

use ds4_model::rope::Rope as CpuRope;
use ds4_quant::GgmlType;
use ds4_wgpu::ops::{ActBlocks, Attention, AttentionBuffers, AttentionShape, ExpertMatVec, ExpertMatVecI8, HcDims, HcPre, MatVec, MatVecI8, Product, QuantizeQ8};
use ds4_wgpu::shaders::{expert_shape, matvec_shape, matvec_shapes, MatVecShape};
use ds4_wgpu::{Encoder, Gpu, GpuBuffer, GpuOptions, ResidentTensor, Step, WgpuError};

type R<T> = Result<T, String>;

fn es(e: WgpuError) -> String { e.to_string() }

fn main() {
    if let Err(e) = run() {
        eprintln!("wgpu_kernel_bench: {e}");
        std::process::exit(1);
    }
}

/// Bytes a run should stream at least, so the weights do not stay in the GPU's caches.
const ROTATE_BYTES: usize = 600 << 20;

fn run() -> R<()> {
    let mut opts = GpuOptions::default();
    let mut iters = 200usize;
    let mut sweep = false;
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        match a.as_str() {
            "--checked" => opts.runtime_checks = true,
            "--sweep" => sweep = true,
            "--adapter" => opts.adapter_name = Some(it.next().ok_or("--adapter needs a name")?),
            n => iters = n.parse().map_err(|_| format!("not a number or flag: {n}"))?,
        }
    }
    let gpu = Gpu::new(&opts).map_err(es)?;
    let c = gpu.caps();
    println!("adapter {} ({:?}), subgroups {}, f16 {}, runtime checks {}", c.adapter, c.backend, c.subgroup, c.f16, opts.runtime_checks);
    println!("kernel,shape,us_per_dispatch,gb_per_s");
    let cfg = ds4_model::synth::shape("flash").map_err(|e| e.to_string())?;
    let x = GpuBuffer::from_slice(&gpu, "x", &vec![0.01f32; 64 * 1024]).map_err(es)?;
    let y = GpuBuffer::new(&gpu, "y", 256 * 1024).map_err(es)?;

    // A dispatch alone: 8 rows of 256 (one workgroup's work, nothing to stream).
    mat_vecs(&gpu, "dispatch", GgmlType::Q8_0, 8, 256, &x, &y, iters * 4, 1, &[])?;
    let e = cfg.n_embd;
    let q8 = [
        ("q_a", cfg.q_lora, e),
        ("kv", cfg.head_dim, e),
        ("q_b", cfg.n_head * cfg.head_dim, cfg.q_lora),
        ("out_b", e, cfg.o_groups * cfg.o_lora),
        ("shexp_gate", cfg.ff_exp, e),
        ("shexp_down", e, cfg.ff_exp),
        ("head", 129280, e),
    ];
    let shapes = if sweep { matvec_shapes() } else { Vec::new() };
    for (name, rows, cols) in q8 {
        let copies = ROTATE_BYTES.div_ceil(rows * cols * 34 / 32).clamp(1, 64);
        mat_vecs(&gpu, name, GgmlType::Q8_0, rows, cols, &x, &y, iters, copies, &shapes)?;
    }
    // The Q8_0 products against int8 activations (the CPU's Fast path), and the quantization.
    int8_mat_vecs(&gpu, &q8[..6], &x, iters)?;
    // The same bytes as out_b in F16 (aligned 16-byte loads, no block decode): what the products
    // reach when a row's loads are simplest.
    mat_vecs(&gpu, "f16_ref", GgmlType::F16, 4096, 4096, &x, &y, iters, 18, &shapes)?;
    experts(&gpu, "exp_gate_iq2xxs", GgmlType::IQ2_XXS, cfg.ff_exp, e, cfg.n_expert, cfg.n_expert_used, iters, &shapes)?;
    experts(&gpu, "exp_down_q2k", GgmlType::Q2_K, e, cfg.ff_exp, cfg.n_expert, cfg.n_expert_used, iters, &shapes)?;
    int8_experts(&gpu, "exp_gate_iq2xxs_i8", cfg.ff_exp, e, cfg.n_expert, cfg.n_expert_used, iters)?;
    for ratio in [0usize, 4, 128] {
        attention(&gpu, &cfg, ratio, 4096, iters)?;
    }
    hc_entry(&gpu, &cfg, iters, &shapes)?;
    // Prefill: the tiled products of a 4096-token chunk, on this device's tiles and, where it has
    // cooperative matrices, on the f32 tiles of a second device opened without them.
    prefill_tiles(&gpu, &cfg, iters)?;
    if gpu.caps().coop.is_some() {
        let mut o = opts.clone();
        o.disable |= ds4_wgpu::wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX;
        let f32_gpu = Gpu::new(&o).map_err(es)?;
        prefill_tiles(&f32_gpu, &cfg, iters)?;
    }
    Ok(())
}

/// The tiled products of a 4096-token prefill chunk at Flash's dense shapes (Q8_0 q_b, out_b, shared
/// expert gate; the same gate shape in IQ2_XXS, the routed experts' type): µs per dispatch and
/// TFLOP/s (in the gb_per_s column), tagged with the tile kind.
fn prefill_tiles(gpu: &Gpu, cfg: &ds4_model::config::Config, iters: usize) -> R<()> {
    let ntok = 4096usize;
    let e = cfg.n_embd;
    let tag = match gpu.caps().coop { Some(n) => format!("coop{n}"), None => "f32".to_string() };
    let shapes = [
        ("q_b", GgmlType::Q8_0, cfg.n_head * cfg.head_dim, cfg.q_lora),
        ("out_b", GgmlType::Q8_0, e, cfg.o_groups * cfg.o_lora),
        ("shexp_gate", GgmlType::Q8_0, cfg.ff_exp, e),
        ("gate_iq2xxs", GgmlType::IQ2_XXS, cfg.ff_exp, e),
    ];
    for (name, ty, rows, cols) in shapes {
        let w = ds4_quant::random_valid_blocks(ty, 7, rows * cols / ty.block_elems());
        let t = ResidentTensor::upload(gpu, name, ty, &w, rows, cols).map_err(es)?;
        let x = GpuBuffer::from_slice(gpu, "tile x", &vec![0.01f32; ntok * cols]).map_err(es)?;
        let y = GpuBuffer::new(gpu, "tile y", ntok * rows).map_err(es)?;
        let op = MatVec::new(gpu, &t, &x, &y, Product::Batched { max_tokens: ntok as u32 }).map_err(es)?;
        let us = time(gpu, Step { ntok: ntok as u32, pos: 0 }, (iters / 20).max(3), |e, _| op.encode(e))?;
        let flop = 2.0 * (ntok * rows * cols) as f64;
        println!("tile_{tag}_{name},{ntok}x{}x{rows}x{cols},{us:.2},{:.1}", ty.name(), flop / us / 1e6);
    }
    Ok(())
}

/// The Q8_0 mat-vecs of `shapes` against int8 activations (`MatVecI8`, rows `name_i8`), and the
/// activation row's quantization alone (`quantize_q8_0`, Flash's width).
fn int8_mat_vecs(gpu: &Gpu, shapes: &[(&str, usize, usize)], x: &GpuBuffer, iters: usize) -> R<()> {
    let max_cols = shapes.iter().map(|s| s.2).max().unwrap_or(32);
    let xq = GpuBuffer::new(gpu, "xq", max_cols / 4).map_err(es)?;
    let xd = GpuBuffer::new(gpu, "xd", max_cols / 32).map_err(es)?;
    let y = GpuBuffer::new(gpu, "y i8", shapes.iter().map(|s| s.1).max().unwrap_or(1)).map_err(es)?;
    let q = QuantizeQ8::new(gpu, ActBlocks::Q8_0, x, max_cols, &xq, &xd, max_cols, 1).map_err(es)?;
    let us = time(gpu, Step { ntok: 1, pos: 0 }, iters, |e, _| q.encode(e))?;
    println!("quantize_q8_0,{max_cols},{us:.2},");
    gpu.run(Step { ntok: 1, pos: 0 }, |e| q.encode(e)).map_err(es)?;
    for &(name, rows, cols) in shapes {
        let copies = ROTATE_BYTES.div_ceil(rows * cols * 34 / 32).clamp(1, 64);
        let w = ds4_quant::random_valid_blocks(GgmlType::Q8_0, 7, rows * cols / 32);
        let ts: Vec<ResidentTensor> = (0..copies).map(|i| ResidentTensor::upload(gpu, &format!("{name}_i8{i}"), GgmlType::Q8_0, &w, rows, cols)).collect::<Result<_, _>>().map_err(es)?;
        let ops: Vec<MatVecI8> = ts.iter().map(|t| MatVecI8::new(gpu, t, &xq, &xd, &y)).collect::<Result<_, _>>().map_err(es)?;
        let us = time(gpu, Step { ntok: 1, pos: 0 }, iters, |e, i| ops[i % ops.len()].encode(e))?;
        println!("{name}_i8,Q8_0x{rows}x{cols},{us:.2},{:.1}", (rows * cols * 34 / 32) as f64 / us / 1e3);
    }
    Ok(())
}

/// The routed experts' IQ2_XXS gate product against a Q8_K activation row (`ExpertMatVecI8`, the
/// same rotating id sets as `experts`), and that row's quantization alone (`quantize_q8_k`).
fn int8_experts(gpu: &Gpu, name: &str, rows: usize, cols: usize, n_expert: usize, k: usize, iters: usize) -> R<()> {
    let ty = GgmlType::IQ2_XXS;
    let w = ds4_quant::random_valid_blocks(ty, 11, n_expert * rows * cols / ty.block_elems());
    let t = ResidentTensor::upload(gpu, name, ty, &w, n_expert * rows, cols).map_err(es)?;
    drop(w);
    let id_bufs = id_sets(gpu, n_expert, k)?;
    let sets = id_bufs.len();
    let x = GpuBuffer::from_slice(gpu, "x", &vec![0.01f32; cols]).map_err(es)?;
    let (xq, xd) = (GpuBuffer::new(gpu, "xq", cols / 4).map_err(es)?, GpuBuffer::new(gpu, "xd", cols / 256).map_err(es)?);
    let y = GpuBuffer::new(gpu, "y", k * rows).map_err(es)?;
    let q = QuantizeQ8::new(gpu, ActBlocks::Q8_K, &x, cols, &xq, &xd, cols, 1).map_err(es)?;
    let us = time(gpu, Step { ntok: 1, pos: 0 }, iters, |e, _| q.encode(e))?;
    println!("quantize_q8_k,{cols},{us:.2},");
    gpu.run(Step { ntok: 1, pos: 0 }, |e| q.encode(e)).map_err(es)?;
    let ops: Vec<ExpertMatVecI8> = id_bufs.iter().map(|ib| ExpertMatVecI8::new(gpu, &t, n_expert, ib, &xq, &xd, &y, k)).collect::<Result<_, _>>().map_err(es)?;
    let us = time(gpu, Step { ntok: 1, pos: 0 }, iters, |e, i| ops[i % sets].encode(e))?;
    let bytes = (k * rows * cols / ty.block_elems() * ty.block_bytes()) as f64;
    println!("{name},{k}x{}x{rows}x{cols},{us:.2},{:.1}", ty.name(), bytes / us / 1e3);
    Ok(())
}

/// Best of 3: µs per dispatch of `iters` dispatches recorded by `f(enc, i)` in one step.
fn time(gpu: &Gpu, step: Step, iters: usize, f: impl Fn(&mut Encoder, usize) -> Result<(), WgpuError>) -> R<f64> {
    gpu.run(step, |e| f(e, 0)).map_err(es)?;
    gpu.wait().map_err(es)?;
    let mut best = f64::MAX;
    for _ in 0..3 {
        // The host's recording time alone (the GPU starts only at the submit), taken off the total.
        let t0 = Instant::now();
        let mut enc = gpu.begin(step);
        (0..iters).try_for_each(|i| f(&mut enc, i)).map_err(es)?;
        drop(enc);
        let record = t0.elapsed().as_secs_f64();
        let t0 = Instant::now();
        gpu.run(step, |e| (0..iters).try_for_each(|i| f(e, i))).map_err(es)?;
        best = best.min((t0.elapsed().as_secs_f64() - record).max(0.0) / iters as f64);
    }
    Ok(best * 1e6)
}

#[allow(clippy::too_many_arguments)]
/// Uploads `copies` copies of a random `rows` x `cols` matrix and times its product (`mat_vecs_on`).
fn mat_vecs(gpu: &Gpu, name: &str, ty: GgmlType, rows: usize, cols: usize, x: &GpuBuffer, y: &GpuBuffer, iters: usize, copies: usize, sweep: &[MatVecShape]) -> R<()> {
    let w = ds4_quant::random_valid_blocks(ty, 7, rows * cols / ty.block_elems());
    let ts: Vec<ResidentTensor> = (0..copies).map(|i| ResidentTensor::upload(gpu, &format!("{name}{i}"), ty, &w, rows, cols)).collect::<Result<_, _>>().map_err(es)?;
    mat_vecs_on(gpu, name, &ts, x, y, iters, sweep)
}

/// Rotating sets of k expert ids: every dispatch picks other experts (as consecutive layers would).
fn id_sets(gpu: &Gpu, n_expert: usize, k: usize) -> R<Vec<GpuBuffer>> {
    let ids: Vec<u32> = (0..32 * k).map(|i| ((i * 37 + i / k * 11) % n_expert) as u32).collect();
    ids.chunks(k)
        .map(|c| {
            let b = GpuBuffer::new(gpu, "ids", k)?;
            b.write_u32(gpu, c)?;
            Ok(b)
        })
        .collect::<Result<_, WgpuError>>()
        .map_err(es)
}

#[allow(clippy::too_many_arguments)]
fn experts(gpu: &Gpu, name: &str, ty: GgmlType, rows: usize, cols: usize, n_expert: usize, k: usize, iters: usize, sweep: &[MatVecShape]) -> R<()> {
    let nb = n_expert * rows * cols / ty.block_elems();
    let w = ds4_quant::random_valid_blocks(ty, 11, nb);
    let t = ResidentTensor::upload(gpu, name, ty, &w, n_expert * rows, cols).map_err(es)?;
    drop(w);
    let id_bufs = id_sets(gpu, n_expert, k)?;
    let sets = id_bufs.len();
    let x = GpuBuffer::from_slice(gpu, "x", &vec![0.01f32; k * cols]).map_err(es)?;
    let y = GpuBuffer::new(gpu, "y", k * rows).map_err(es)?;
    let bytes = (k * rows * cols / ty.block_elems() * ty.block_bytes()) as f64;
    for shape in std::iter::once(None).chain(sweep.iter().map(Some)) {
        let sh = shape.copied().unwrap_or_else(|| expert_shape(ty, rows, cols, k));
        let ops: Vec<ExpertMatVec> = id_bufs.iter().map(|ib| ExpertMatVec::with_shape(gpu, &t, n_expert, ib, &x, true, &y, k, 1, sh)).collect::<Result<_, _>>().map_err(es)?;
        let us = time(gpu, Step { ntok: 1, pos: 0 }, iters, |e, i| ops[i % sets].encode(e))?;
        let tag = if shape.is_some() { format!("{name}@s{}r{}", sh.seg, sh.rows_per_thread) } else { name.to_string() };
        println!("{tag},{k}x{}x{rows}x{cols},{us:.2},{:.1}", ty.name(), bytes / us / 1e3);
    }
    Ok(())
}

fn attention(gpu: &Gpu, cfg: &ds4_model::config::Config, ratio: usize, pos: usize, iters: usize) -> R<()> {
    let (nh, d, swa) = (cfg.n_head, cfg.head_dim, cfg.swa);
    let top_k = if ratio == 4 { cfg.idx_topk } else { 0 };
    let cap = (pos + 1).checked_div(ratio).map_or(0, |c| c + 1);
    let vals = |n: usize| (0..n).map(|i| ((i * 2654435761usize) % 1000) as f32 * 1e-3 - 0.5).collect::<Vec<f32>>();
    let q = GpuBuffer::from_slice(gpu, "q", &vals(nh * d)).map_err(es)?;
    let kv = GpuBuffer::from_slice(gpu, "kv", &vals(d)).map_err(es)?;
    let ring = GpuBuffer::from_slice(gpu, "ring", &vals(swa * d)).map_err(es)?;
    let comp = GpuBuffer::from_slice(gpu, "comp", &vals(cap.max(1) * d)).map_err(es)?;
    let sel = GpuBuffer::new(gpu, "sel", top_k.max(1)).map_err(es)?;
    if top_k != 0 {
        let picks: Vec<u32> = (0..top_k).map(|i| ((i * 7) % cap) as u32).collect();
        sel.write_u32(gpu, &picks).map_err(es)?;
    }
    let sinks = GpuBuffer::from_slice(gpu, "sinks", &vec![0.0; nh]).map_err(es)?;
    let o = GpuBuffer::new(gpu, "o", nh * d).map_err(es)?;
    let bufs = AttentionBuffers { q: &q, kv: &kv, ring: &ring, comp: (ratio != 0).then_some(&comp), sel: (top_k != 0).then_some(&sel), sinks: &sinks, o: &o };
    let shape = AttentionShape { n_head: nh, head_dim: d, swa, ratio, top_k, capacity: cap.max(1), max_tokens: 1 };
    let op = Attention::new(gpu, &bufs, shape, CpuRope::for_layer(cfg, ratio).freqs()).map_err(es)?;
    let us = time(gpu, Step { ntok: 1, pos: pos as u32 }, iters, |e, _| op.encode(e))?;
    println!("attention_r{ratio},{nh}x{d} at {pos} top_k {top_k},{us:.2},", );
    Ok(())
}

/// The hyper-connection entry of one token at Flash's shape: its mix product alone (F16, n_mix x
/// n_hc * n_embd), then the whole entry (the product and the one-workgroup entry kernel).
fn hc_entry(gpu: &Gpu, cfg: &ds4_model::config::Config, iters: usize, sweep: &[MatVecShape]) -> R<()> {
    let dims = HcDims { n_hc: cfg.n_hc, n_embd: cfg.n_embd, sinkhorn_iters: cfg.sinkhorn_iters, hc_eps: cfg.hc_eps, rms_eps: cfg.rms_eps };
    let (hd, nm, e) = (dims.hc_dim(), dims.n_mix(), cfg.n_embd);
    let w = ds4_quant::random_valid_blocks(GgmlType::F16, 3, nm * hd / GgmlType::F16.block_elems());
    let t = ResidentTensor::upload(gpu, "hc_fn", GgmlType::F16, &w, nm, hd).map_err(es)?;
    let x = GpuBuffer::from_slice(gpu, "streams", &vec![0.01f32; hd]).map_err(es)?;
    let mix = GpuBuffer::new(gpu, "mix", nm).map_err(es)?;
    mat_vecs_on(gpu, "hc_mix", std::slice::from_ref(&t), &x, &mix, iters, sweep)?;
    let xn = GpuBuffer::new(gpu, "xn", e).map_err(es)?;
    let coef = GpuBuffer::new(gpu, "coef", dims.coef_len()).map_err(es)?;
    let op = HcPre::new(gpu, &dims, &t, &[0.1; 3], &vec![0.0; nm], &vec![1.0; e], &x, &mix, &xn, &coef, 1).map_err(es)?;
    let us = time(gpu, Step { ntok: 1, pos: 0 }, iters, |e, _| op.encode(e))?;
    println!("hc_entry,{}x{nm}x{hd} + entry kernel,{us:.2},", GgmlType::F16.name());
    Ok(())
}

/// Times the product of the copies `ts` (dispatches rotate over them) under the shape
/// `matvec_shape` picks, then under each of `sweep`.
fn mat_vecs_on(gpu: &Gpu, name: &str, ts: &[ResidentTensor], x: &GpuBuffer, y: &GpuBuffer, iters: usize, sweep: &[MatVecShape]) -> R<()> {
    let t = &ts[0];
    let bytes = (t.rows * t.row_bytes) as f64;
    for shape in std::iter::once(None).chain(sweep.iter().map(Some)) {
        let sh = shape.copied().unwrap_or_else(|| matvec_shape(t.ty, t.rows, t.cols));
        let ops: Vec<MatVec> = ts.iter().map(|t| MatVec::with_shape(gpu, t, x, y, Product::Vec, sh)).collect::<Result<_, _>>().map_err(es)?;
        let us = time(gpu, Step { ntok: 1, pos: 0 }, iters, |e, i| ops[i % ops.len()].encode(e))?;
        let tag = if shape.is_some() { format!("{name}@s{}r{}", sh.seg, sh.rows_per_thread) } else { name.to_string() };
        println!("{tag},{}x{}x{},{us:.2},{:.1}", t.ty.name(), t.rows, t.cols, bytes / us / 1e3);
    }
    Ok(())
}
