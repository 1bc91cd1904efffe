//! Mat-vec kernel bandwidth on the GPU at the Flash decode shapes, as a fraction of the streaming read
//! bandwidth measured in the same run. Run on the device:
//! `gpu_bench [reps]` (built with `cargo build --release -p ds4-cuda --features cuda --example gpu_bench`).
use ds4_gguf::GgmlType;

fn main() {
    let reps: usize = std::env::args().nth(1).and_then(|v| v.parse().ok()).unwrap_or(50);
    let bytes = 4usize << 30;
    let t = ds4_cuda::bench_read(bytes, 10).unwrap_or_else(|e| panic!("{e}"));
    let bw = bytes as f64 / t / 1e9;
    println!("read bandwidth: {bw:.0} GB/s (4 GiB streamed)");
    println!("what,type,rows,cols,slots,MB,us,GB/s,fraction");
    // (label, type, rows, cols, slots): the per-token matrices of one Flash layer and the head.
    let cases: &[(&str, GgmlType, usize, usize, usize)] = &[
        ("q_a", GgmlType::Q8_0, 1024, 4096, 1),
        ("q_b", GgmlType::Q8_0, 32768, 1024, 1),
        ("kv", GgmlType::Q8_0, 512, 4096, 1),
        ("out_a(group)", GgmlType::Q8_0, 1024, 4096, 8),
        ("out_b", GgmlType::Q8_0, 4096, 8192, 1),
        ("shared gate", GgmlType::Q8_0, 2048, 4096, 1),
        ("shared down", GgmlType::Q8_0, 4096, 2048, 1),
        ("experts gate", GgmlType::IQ2_XXS, 2048, 4096, 6),
        ("experts down", GgmlType::Q2_K, 4096, 2048, 6),
        ("experts gate q4", GgmlType::Q4_K, 2048, 4096, 6),
        ("compressor kv", GgmlType::F16, 1024, 4096, 1),
        ("indexer q_b", GgmlType::F16, 8192, 1024, 1),
        ("hc_fn", GgmlType::F16, 24, 16384, 1),
        ("gate_inp", GgmlType::F16, 256, 4096, 1),
        ("output head", GgmlType::Q8_0, 129280, 4096, 1),
    ];
    for &(what, ty, rows, cols, z) in cases {
        let mb = (ty.row_bytes(cols).unwrap() * rows * z) as f64 / 1e6;
        match ds4_cuda::bench_matvec(ty, rows, cols, z, reps) {
            Ok(s) => println!("{what},{},{rows},{cols},{z},{mb:.2},{:.2},{:.0},{:.3}", ty.name(), s * 1e6, mb / 1e3 / s, mb / 1e3 / s / bw),
            Err(e) => println!("{what},{},{rows},{cols},{z},{mb:.2},error: {e}", ty.name()),
        }
    }
    // Prefill GEMMs (f16 in, f32 out) at 4096 tokens: GPU time and host time per call.
    println!("gemm,rows,tokens,cols,us,TFLOPS,host_us");
    for &(m, k) in &[(512usize, 4096usize), (1024, 4096), (32768, 1024), (4096, 8192), (2048, 4096), (4096, 2048), (256, 4096)] {
        let n = 4096;
        match ds4_cuda::bench_gemm(m, n, k, 20) {
            Ok((s, h)) => println!("gemm,{m},{n},{k},{:.1},{:.0},{:.1}", s * 1e6, 2.0 * (m * n * k) as f64 / s / 1e12, h * 1e6),
            Err(e) => println!("gemm,{m},{n},{k},error: {e}"),
        }
    }
    // The int8-activation decode kernels of Precision::Fast, weights not in L2, by K split
    // (ks 0 = the engine's choice).
    println!("cold,type,rows,cols,slots,MB,ks,us,GB/s,fraction");
    for &(what, ty, rows, cols, z) in &[
        ("experts gate", GgmlType::IQ2_XXS, 2048usize, 4096usize, 6usize),
        ("experts gate+up", GgmlType::IQ2_XXS, 2048, 4096, 12),
        ("experts down", GgmlType::Q2_K, 4096, 2048, 6),
        ("q_a", GgmlType::Q8_0, 1024, 4096, 1),
        ("q_b", GgmlType::Q8_0, 32768, 1024, 1),
        ("out_a", GgmlType::Q8_0, 1024, 4096, 8),
        ("out_b", GgmlType::Q8_0, 4096, 8192, 1),
        ("shared gate", GgmlType::Q8_0, 2048, 4096, 1),
    ] {
        let mb = (ty.row_bytes(cols).unwrap() * rows * z) as f64 / 1e6;
        for ks in [0usize, 1, 2, 4, 8] {
            match ds4_cuda::bench_matvec_fast(ty, rows, cols, z, reps, ks) {
                Ok(s) => println!("cold {what},{},{rows},{cols},{z},{mb:.2},{ks},{:.2},{:.0},{:.3}", ty.name(), s * 1e6, mb / 1e3 / s, mb / 1e3 / s / bw),
                Err(e) => println!("cold {what},{},{rows},{cols},{z},{mb:.2},{ks},error: {e}", ty.name()),
            }
        }
    }
    // The int8-activation (Q8_K) decode kernels of Precision::Fast at the expert shapes. Q8_0 runs
    // mvq8_q8p_r* (the output head, with more tasks than 8 a block, mvq8_q8s_n1).
    for &(what, ty, rows, cols, z) in &[
        ("experts gate fast", GgmlType::IQ2_XXS, 2048usize, 4096usize, 6usize),
        ("experts down fast", GgmlType::Q2_K, 4096, 2048, 6),
        ("q_a fast", GgmlType::Q8_0, 1024, 4096, 1),
        ("q_b fast", GgmlType::Q8_0, 32768, 1024, 1),
        ("kv fast", GgmlType::Q8_0, 512, 4096, 1),
        ("out_a fast", GgmlType::Q8_0, 1024, 4096, 8),
        ("out_b fast", GgmlType::Q8_0, 4096, 8192, 1),
        ("shared gate fast", GgmlType::Q8_0, 2048, 4096, 1),
        ("shared down fast", GgmlType::Q8_0, 4096, 2048, 1),
        ("output head fast", GgmlType::Q8_0, 129280, 4096, 1),
    ] {
        let mb = (ty.row_bytes(cols).unwrap() * rows * z) as f64 / 1e6;
        match ds4_cuda::bench_matvec_fast(ty, rows, cols, z, reps, 0) {
            Ok(s) => println!("{what},{},{rows},{cols},{z},{mb:.2},{:.2},{:.0},{:.3}", ty.name(), s * 1e6, mb / 1e3 / s, mb / 1e3 / s / bw),
            Err(e) => println!("{what},{},{rows},{cols},{z},{mb:.2},error: {e}", ty.name()),
        }
    }
}
