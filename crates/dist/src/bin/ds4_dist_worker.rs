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
    match ds4_dist::cli::worker_main(&d, a.model.as_deref(), a.ctx, a.threads, a.debug) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ds4-dist-worker: {e}");
            ExitCode::from(ds4_dist::cli::exit_code(&e))
        }
    }
}
