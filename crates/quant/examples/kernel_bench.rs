//! Mat-vec kernel benchmark: weight GB/s per type vs this machine's read bandwidth measured in
//! the same run (multithreaded plain sum over an equally large buffer, same thread count).
//!
//!   cargo run --release -p ds4-quant --example kernel_bench -- --threads 2 [--mib 512] [--reps 7]
//!       [--csv bench/results/kernels.csv] [--types Q8_0,Q2_K]
use std::time::Instant;

use ds4_quant::{detect_isa, matvec, random_valid_blocks, GgmlType, MatRef, Precision};
use rayon::prelude::*;

fn arg(args: &[String], name: &str) -> Option<String> {
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1).cloned())
}

/// One multithreaded plain u64 sum over `buf` (the read-bandwidth probe); returns seconds.
fn read_once(buf: &[u64]) -> f64 {
    let chunk = (buf.len() / (rayon::current_num_threads() * 4)).max(1);
    let t = Instant::now();
    let s = buf.par_chunks(chunk).map(|c| c.iter().fold(0u64, |a, &b| a.wrapping_add(b))).reduce(|| 0, u64::wrapping_add);
    let dt = t.elapsed().as_secs_f64();
    std::hint::black_box(s);
    dt
}

/// The 1/5/15-minute load averages (Linux), for the CSV header.
fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "n/a".into())
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let threads: usize = arg(&args, "--threads").map(|s| s.parse().unwrap()).unwrap_or(2);
    let mib: usize = arg(&args, "--mib").map(|s| s.parse().unwrap()).unwrap_or(512);
    let reps: usize = arg(&args, "--reps").map(|s| s.parse().unwrap()).unwrap_or(7);
    let csv = arg(&args, "--csv").unwrap_or_else(|| "bench/results/kernels.csv".into());
    rayon::ThreadPoolBuilder::new().num_threads(threads).build_global().unwrap();
    let bytes = mib << 20;
    let cols = 4096usize;

    // Bandwidth buffer, touched (non-zero) so pages are really mapped.
    let mut bw_buf = vec![0u64; bytes / 8];
    bw_buf.par_iter_mut().enumerate().for_each(|(i, v)| *v = i as u64 ^ 0x9E37_79B9);

    let mut lines = vec![
        format!("# cargo run --release -p ds4-quant --example kernel_bench -- --threads {threads} --mib {mib} --reps {reps}"),
        format!("# isa={:?}; weights {mib} MiB per type, cols={cols}; {reps} interleaved (read-probe, matvec) pairs after one warm-up pair, best of each; read_bw = multithreaded u64 sum over a separate {mib} MiB buffer", detect_isa()),
        "type,threads,weight_mib,rows,cols,best_ms,weight_gbps,read_bw_gbps,ratio".to_string(),
    ];
    lines.insert(2, format!("# load average at start: {}", loadavg()));
    println!("{}", lines[1]);
    let all = [GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::Q2_K, GgmlType::IQ2_XXS, GgmlType::F16];
    let only = arg(&args, "--types");
    for ty in all.into_iter().filter(|t| only.as_deref().is_none_or(|o| o.split(',').any(|n| n == t.name()))) {
        let rb = ty.row_bytes(cols).unwrap();
        let rows = bytes / rb;
        // Tile a 4 MiB random pattern of valid blocks over the whole matrix.
        let pat_blocks = (4 << 20) / ty.block_bytes();
        let pat = random_valid_blocks(ty, 1234, pat_blocks);
        let mut data = vec![0u8; rows * rb];
        data.par_chunks_mut(pat.len()).for_each(|c| c.copy_from_slice(&pat[..c.len()]));
        let w = MatRef::new(ty, &data, rows, cols).unwrap();
        let x: Vec<f32> = (0..cols).map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0).collect();
        let mut y = vec![0f32; rows];
        // Interleaved: each rep times one bandwidth probe, then one matvec; best of each.
        // Back-to-back pairs see the same machine load, so the ratio is robust to load drift.
        read_once(&bw_buf);
        matvec(&w, &x, &mut y, Precision::Fast);
        let (mut best_bw, mut s) = (f64::INFINITY, f64::INFINITY);
        for _ in 0..reps {
            best_bw = best_bw.min(read_once(&bw_buf));
            let t = Instant::now();
            matvec(&w, &x, &mut y, Precision::Fast);
            s = s.min(t.elapsed().as_secs_f64());
            std::hint::black_box(&y);
        }
        let bw = bytes as f64 / best_bw / 1e9;
        let gbps = data.len() as f64 / s / 1e9;
        let line = format!(
            "{},{threads},{:.0},{rows},{cols},{:.2},{:.2},{:.2},{:.3}",
            ty.name(), data.len() as f64 / (1 << 20) as f64, s * 1e3, gbps, bw, gbps / bw
        );
        println!("{line}");
        lines.push(line);
    }
    lines.push(format!("# load average at end: {}", loadavg()));
    if let Some(dir) = std::path::Path::new(&csv).parent() {
        std::fs::create_dir_all(dir).ok();
    }
    std::fs::write(&csv, lines.join("\n") + "\n").unwrap();
    println!("wrote {csv}");
}
