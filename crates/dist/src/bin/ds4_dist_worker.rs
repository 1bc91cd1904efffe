//! `ds4-dist-worker`: the worker loop alone (what `ds4 --role worker` runs), for tests and
//! deployments that want a small binary.
use clap::Parser;
use ds4_dist::DistArgs;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Parser, Debug)]
#[command(name = "ds4-dist-worker", about = "DwarfStar distributed worker (serves a layer slice)")]
struct Args {
    #[arg(short = 'm', long = "model")]
    model: Option<PathBuf>,
    #[arg(short = 'c', long = "ctx", default_value_t = 32768)]
    ctx: usize,
    #[arg(short = 't', long = "threads")]
    threads: Option<usize>,
    /// Prompt tokens per forward call (larger batches from the coordinator run in pieces). Default: on
    /// a GPU the largest of 4096, 2048, 1024, 512, 256 that fits beside the weights; 256 on the CPU.
    #[arg(long = "prefill-chunk")]
    prefill_chunk: Option<usize>,
    /// Host memory of the weights: copy (huge-page memory, faster CPU decode; the CPU default) or mmap
    /// (map the file; a GPU backend's default).
    #[arg(long = "weights", env = "DS4_WEIGHTS", value_parser = ds4_engine::WeightMemory::parse)]
    weights: Option<ds4_engine::WeightMemory>,
    /// Read every weight page at startup (parallel pre-fault of the mapping, with progress), for no
    /// first-use stalls; --weights copy reads them all anyway.
    #[arg(long = "warm-weights")]
    warm_weights: bool,
    /// Compute backend: cpu, cuda (binary built with --features cuda), vulkan or metal (built with
    /// --features wgpu), or auto (the best one built in and present).
    #[arg(long = "backend", default_value = "cpu")]
    backend: String,
    #[arg(long = "debug")]
    debug: bool,
    #[command(flatten)]
    dist: DistArgs,
}

fn main() -> ExitCode {
    let a = Args::parse();
    let mut d = a.dist.clone();
    if d.role.is_none() {
        d.role = Some(ds4_dist::Role::Worker);
    }
    let backend = match ds4_engine::Backend::parse(&a.backend).and_then(|b| b.built().map(|()| b)) {
        Ok(b) => b,
        Err(e) => {
            eprintln!("ds4-dist-worker: {e}");
            return ExitCode::from(2);
        }
    };
    let load = ds4_engine::LoadOptions { ctx: a.ctx, threads: a.threads, backend, debug: a.debug, weights: a.weights, warm_weights: a.warm_weights, ..Default::default() }.chunk_flag(a.prefill_chunk);
    match ds4_dist::cli::worker_main(&d, a.model.as_deref(), &load) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ds4-dist-worker: {e}");
            ExitCode::from(ds4_dist::cli::exit_code(&e))
        }
    }
}
