//! In-cache single-thread kernel throughput (compute cost per weight byte, no DRAM traffic):
//! a ~1 MiB weight slab (fits L2) dotted row by row with one activation row per kernel table,
//! then the same slab through `matvec` on a 1-thread pool (the real driver path), best of N.
//!
//!   cargo run --release -p ds4-quant --example kernel_micro [-- --kib 1024 --reps 50]
use std::time::Instant;

use ds4_quant::{matvec, quantize_row_q8_0, quantize_row_q8_k, random_valid_blocks, GgmlType, Isa, Kernels, MatRef, Precision};

fn arg(args: &[String], name: &str) -> Option<String> {
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1).cloned())
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let kib: usize = arg(&args, "--kib").map(|s| s.parse().unwrap()).unwrap_or(1024);
    let reps: usize = arg(&args, "--reps").map(|s| s.parse().unwrap()).unwrap_or(50);
    let cols = 4096usize;
    let x: Vec<f32> = (0..cols).map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0).collect();
    println!("type,isa,in_cache_gbps,ns_per_256_elems");
    for ty in [GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::Q2_K, GgmlType::IQ2_XXS, GgmlType::F16] {
        let rb = ty.row_bytes(cols).unwrap();
        let rows = (kib << 10) / rb;
        let w = random_valid_blocks(ty, 77, rows * cols / ty.block_elems());
        let a = match ty {
            GgmlType::Q8_0 => {
                let mut a = vec![0u8; GgmlType::Q8_0.row_bytes(cols).unwrap()];
                quantize_row_q8_0(&x, &mut a);
                a
            }
            _ => {
                let mut a = vec![0u8; GgmlType::Q8_K.row_bytes(cols).unwrap()];
                quantize_row_q8_k(&x, &mut a);
                a
            }
        };
        for isa in Isa::all() {
            let Some(k) = Kernels::for_isa(isa) else { continue };
            let mut sink = 0f32;
            let mut best = f64::INFINITY;
            for _ in 0..reps {
                let t = Instant::now();
                for r in 0..rows {
                    let row = &w[r * rb..(r + 1) * rb];
                    sink += match ty {
                        GgmlType::Q8_0 => (k.q8_0)(row, &a),
                        GgmlType::Q4_K => (k.q4_k)(row, &a),
                        GgmlType::Q2_K => (k.q2_k)(row, &a),
                        GgmlType::IQ2_XXS => (k.iq2_xxs)(row, &a),
                        _ => (k.f16)(row, &x),
                    };
                }
                best = best.min(t.elapsed().as_secs_f64());
            }
            std::hint::black_box(sink);
            let bytes = (rows * rb) as f64;
            println!("{},{:?},{:.2},{:.2}", ty.name(), isa, bytes / best / 1e9, best * 1e9 / (rows * cols / 256) as f64);
        }
        // The real driver path (best ISA, activation prepared once per call), 1 thread.
        let m = MatRef::new(ty, &w, rows, cols).unwrap();
        let mut y = vec![0f32; rows];
        let pool = rayon::ThreadPoolBuilder::new().num_threads(1).build().unwrap();
        let mut best = f64::INFINITY;
        pool.install(|| {
            for _ in 0..reps {
                let t = Instant::now();
                matvec(&m, &x, &mut y, Precision::Fast);
                best = best.min(t.elapsed().as_secs_f64());
            }
        });
        std::hint::black_box(&y);
        let bytes = (rows * rb) as f64;
        println!("{},matvec,{:.2},{:.2}", ty.name(), bytes / best / 1e9, best * 1e9 / (rows * cols / 256) as f64);
    }
}
