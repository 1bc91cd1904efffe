//! Prints the chosen adapter and its capabilities, then times the mat-vec kernels of every quant
//! type on random valid weights (one submit of `iters` dispatches, wall clock): a first look at a
//! new GPU (e.g. the H200 through Vulkan) before the GPU stage exists.
//!
//! cargo run --release -p ds4-wgpu --example wgpu_probe -- [ROWS COLS ITERS] [--fallback] [--adapter NAME]
use std::time::Instant;

use ds4_wgpu::ops::{MatVec, Product};
use ds4_wgpu::shaders::MATVEC_TYPES;
use ds4_wgpu::{Gpu, GpuBuffer, GpuOptions, ResidentTensor, Step};

fn main() {
    if let Err(e) = run() {
        eprintln!("wgpu_probe: {e}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), String> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut nums = Vec::new();
    let mut opts = GpuOptions::default();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--fallback" => opts.disable = ds4_wgpu::wgpu::Features::SUBGROUP | ds4_wgpu::wgpu::Features::SHADER_F16,
            "--adapter" => opts.adapter_name = Some(it.next().ok_or("--adapter needs a name")?.clone()),
            n => nums.push(n.parse::<usize>().map_err(|_| format!("not a number or flag: {n}"))?),
        }
    }
    let (rows, cols, iters) = match nums[..] {
        [] => (4096, 4096, 20),
        [r, c, i] if r > 0 && c % 512 == 0 && c > 0 && i > 0 => (r, c, i),
        _ => return Err("usage: wgpu_probe [ROWS COLS ITERS] (COLS a multiple of 512) [--fallback] [--adapter NAME]".into()),
    };
    let gpu = Gpu::new(&opts).map_err(|e| e.to_string())?;
    println!("{:#?}", gpu.caps());
    let x = GpuBuffer::from_slice(&gpu, "x", &vec![0.01f32; cols]).map_err(|e| e.to_string())?;
    let y = GpuBuffer::new(&gpu, "y", rows).map_err(|e| e.to_string())?;
    for ty in MATVEC_TYPES {
        let w = ds4_quant::random_valid_blocks(ty, 1, rows * cols / ty.block_elems());
        let t = ResidentTensor::upload(&gpu, ty.name(), ty, &w, rows, cols).map_err(|e| e.to_string())?;
        let op = MatVec::new(&gpu, &t, &x, &y, Product::Vec).map_err(|e| e.to_string())?;
        // Warm-up (pipeline compilation happens at the first dispatch on some drivers).
        gpu.run(Step { ntok: 1, pos: 0 }, |e| op.encode(e)).map_err(|e| e.to_string())?;
        let t0 = Instant::now();
        gpu.run(Step { ntok: 1, pos: 0 }, |e| (0..iters).try_for_each(|_| op.encode(e))).map_err(|e| e.to_string())?;
        let s = t0.elapsed().as_secs_f64() / iters as f64;
        let bytes = w.len() as f64;
        println!(
            "{:8} {rows}x{cols}: {:9.3} ms/mat-vec, {:8.2} GB/s of weights ({} parts, {:?}, {:?})",
            ty.name(),
            s * 1e3,
            bytes / s / 1e9,
            t.parts.len(),
            op.shape,
            op.f16
        );
    }
    Ok(())
}
