//! `ds4-bench`: prefill and decode throughput at growing context frontiers, as CSV
//! (`ctx_tokens,prefill_tokens,prefill_tps,gen_tokens,gen_tps,kvcache_bytes`).
//! Method: prefill incrementally to each frontier, snapshot the KV state, generate greedily, restore.
use clap::Parser;
use ds4_engine::{resolve_model, Engine, GenStats, LoadOptions, ModelSource, Session};
use ds4_tokenizer::sampling::argmax;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::AtomicBool;
use std::time::Instant;

#[derive(Parser, Debug)]
#[command(name = "ds4-bench", about = "DwarfStar throughput benchmark over context frontiers (CSV on stdout)", version)]
struct Args {
    #[arg(short = 'm', long = "model")]
    model: Option<PathBuf>,
    /// Text whose tokens fill the context (repeated if shorter than --ctx-max).
    #[arg(long = "prompt-file")]
    prompt_file: PathBuf,
    #[arg(long = "ctx-start", default_value_t = 512)]
    ctx_start: usize,
    #[arg(long = "ctx-max", default_value_t = 4096)]
    ctx_max: usize,
    /// Frontier step (additive).
    #[arg(long = "step-incr", conflicts_with = "step_mul")]
    step_incr: Option<usize>,
    /// Frontier step (multiplicative, > 1).
    #[arg(long = "step-mul")]
    step_mul: Option<f64>,
    /// Context size to allocate (default: --ctx-max + --gen-tokens + 1).
    #[arg(short = 'c', long = "ctx")]
    ctx: Option<usize>,
    #[arg(long = "gen-tokens", default_value_t = 32)]
    gen_tokens: usize,
    #[arg(short = 't', long = "threads")]
    threads: Option<usize>,
    #[arg(long = "prefill-chunk", default_value_t = 256)]
    prefill_chunk: usize,
    /// Memory budget in GiB (default: the RAM available now); a plan over it refuses to start.
    #[arg(long = "mem-limit-gb")]
    mem_limit_gb: Option<f64>,
    /// Also measure this machine's read bandwidth and report decode as a fraction of it (stderr).
    #[arg(long = "bandwidth")]
    bandwidth: bool,
    /// Write the CSV here instead of stdout.
    #[arg(long = "csv")]
    csv: Option<PathBuf>,
    /// Host memory of the weights: copy (huge-page memory, faster CPU decode; the CPU default) or mmap
    /// (map the file; a GPU backend's default).
    #[arg(long = "weights", env = "DS4_WEIGHTS", value_parser = ds4_engine::WeightMemory::parse)]
    weights: Option<ds4_engine::WeightMemory>,
    /// Read every weight page at startup (parallel pre-fault of the mapping, with progress), for no
    /// first-use stalls; --weights copy reads them all anyway.
    #[arg(long = "warm-weights")]
    warm_weights: bool,
    /// Compute backend: cpu, or cuda (NVIDIA GPU; binary built with --features cuda).
    #[arg(long = "backend", default_value = "cpu")]
    backend: String,
    /// With --backend cuda: GPUs the layers are spread over, in contiguous parts (e.g. 0,1,2,3).
    #[arg(long = "cuda-devices", value_delimiter = ',', default_value = "0")]
    cuda_devices: Vec<usize>,
    /// With --backend cuda: report decode as a fraction of this memory bandwidth (GB/s).
    #[arg(long = "gpu-bw-gbps", default_value_t = 4800.0)]
    gpu_bw_gbps: f64,
    /// Verbose diagnostics (distributed per-hop telemetry) on stderr.
    #[arg(long = "debug")]
    debug: bool,
    /// Distributed inference (--role coordinator, --layers, --listen, --dist-*).
    #[command(flatten)]
    dist: ds4_dist::DistArgs,
}

fn main() -> ExitCode {
    let a = Args::parse();
    match run(a) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ds4-bench: {e}");
            ExitCode::from(1)
        }
    }
}

/// Context frontiers from start to max (inclusive when reached exactly).
fn frontiers(a: &Args) -> Result<Vec<usize>, String> {
    if a.ctx_start == 0 || a.ctx_start > a.ctx_max {
        return Err("need 0 < --ctx-start <= --ctx-max".into());
    }
    let mut v = vec![a.ctx_start];
    loop {
        let cur = *v.last().unwrap();
        let next = match (a.step_incr, a.step_mul) {
            (Some(0), _) => return Err("--step-incr must be positive".into()),
            (Some(s), _) => cur + s,
            (None, Some(m)) if m > 1.0 => ((cur as f64) * m).ceil() as usize,
            (None, Some(_)) => return Err("--step-mul must be > 1".into()),
            (None, None) => cur * 2,
        };
        if next > a.ctx_max {
            break;
        }
        v.push(next);
    }
    Ok(v)
}

fn run(a: Args) -> Result<(), String> {
    if a.prefill_chunk == 0 {
        return Err("--prefill-chunk must be at least 1".into());
    }
    let fr = frontiers(&a)?;
    let backend = ds4_engine::Backend::parse(&a.backend).map_err(|e| e.to_string())?;
    let load = LoadOptions { threads: a.threads, prefill_chunk: a.prefill_chunk, mem_limit_gb: a.mem_limit_gb, backend, cuda_devices: a.cuda_devices.clone(), debug: a.debug, weights: a.weights, warm_weights: a.warm_weights, ..LoadOptions::default() };
    if let Err(e) = load.validate() {
        eprintln!("ds4-bench: {e}");
        std::process::exit(2);
    }
    if a.dist.active() || a.dist.validate().is_err() {
        let b = ds4_dist::cli::BenchRun { model: a.model.as_deref(), prompt_file: a.prompt_file.clone(), frontiers: fr, gen_tokens: a.gen_tokens, load, csv: a.csv.clone() };
        return ds4_dist::cli::bench_main(&a.dist, &b).map_err(|e| std::process::exit({ eprintln!("ds4-bench: {e}"); ds4_dist::cli::exit_code(&e) as i32 }));
    }
    let text = std::fs::read_to_string(&a.prompt_file).map_err(|e| format!("cannot read {}: {e}", a.prompt_file.display()))?;
    let src = resolve_model(a.model.as_deref()).map_err(|e| e.to_string())?;
    if let ModelSource::EmbeddedDefault(p) = &src {
        eprintln!("ds4-bench: using the embedded tiny default model {}", p.display());
    }
    let need = a.ctx_max + a.gen_tokens + 1;
    let ctx = a.ctx.unwrap_or(need);
    if ctx < need {
        return Err(format!("--ctx {ctx} is smaller than --ctx-max + --gen-tokens + 1 = {need}"));
    }
    let opts = LoadOptions { ctx, debug: false, ..load };
    let mut eng = Engine::load(src.path(), &opts).map_err(|e| format!("{}: {e}", src.path().display()))?;
    if let Some(r) = eng.backend_report() {
        eprintln!("after load: {r}");
    }
    let tok = eng.tokenizer().map_err(|e| e.to_string())?;
    let base = tok.encode(&text);
    if base.is_empty() {
        return Err("the prompt file has no tokens".into());
    }
    if base.len() < a.ctx_max {
        eprintln!("ds4-bench: prompt has {} tokens; repeating it to reach {}", base.len(), a.ctx_max);
    }
    let toks: Vec<u32> = base.iter().cycle().take(a.ctx_max).copied().collect();
    let mut out: Box<dyn Write> = match &a.csv {
        Some(p) => Box::new(std::fs::File::create(p).map_err(|e| format!("cannot create {}: {e}", p.display()))?),
        None => Box::new(std::io::stdout()),
    };
    writeln!(out, "ctx_tokens,prefill_tokens,prefill_tps,gen_tokens,gen_tps,kvcache_bytes").map_err(|e| e.to_string())?;
    let mut s = Session::new(&eng);
    s.prefill_chunk = a.prefill_chunk;
    let never = AtomicBool::new(false);
    let mut done = 0;
    for &f in &fr {
        let t0 = Instant::now();
        let n = s.sync(&mut eng, &toks[..f], &mut |_, _| {}, &never).map_err(|e| e.to_string())?;
        let pt = t0.elapsed().as_secs_f64();
        if eng.backend() == ds4_engine::Backend::Cuda && std::env::var_os("DS4_CUDA_PROFILE").is_some() {
            // Separate prefill and decode kernel profiles.
            if let Some(r) = eng.backend_report() {
                eprintln!("ctx {f} prefill: {r}");
            }
        }
        debug_assert_eq!(n, f - done);
        done = f;
        let kv_bytes = s.kv.bytes();
        let snap = (s.kv.clone(), s.tokens.clone(), s.logits.clone());
        let mut st = GenStats::default();
        let mut ids = Vec::new();
        s.generate(&mut eng, a.gen_tokens, None, true, &mut |l| argmax(l), &mut |t| { ids.push(t); true }, &never, &mut st).map_err(|e| e.to_string())?;
        if a.debug {
            // For comparing runs (e.g. a distributed route against this single process).
            eprintln!("ctx {f}: greedy token ids {ids:?}");
        }
        (s.kv, s.tokens, s.logits) = snap;
        writeln!(out, "{f},{n},{:.2},{},{:.2},{kv_bytes}", n as f64 / pt, st.gen_tokens, st.gen_tps()).map_err(|e| e.to_string())?;
        if a.bandwidth {
            let cfg = eng.cfg().clone();
            let bpt = eng.stage.w.decode_bytes(cfg.n_expert_used, f / 4 > cfg.idx_topk) as f64;
            let bw = ds4_engine::membw::read_bandwidth_gbps(1024, 3);
            let eff = bpt * st.gen_tps() / 1e9;
            eprintln!(
                "ctx {f}: decode reads {:.1} MiB of weights per token; {:.2} t/s = {eff:.2} GB/s; read bandwidth {bw:.2} GB/s; ratio {:.3}",
                bpt / (1u64 << 20) as f64,
                st.gen_tps(),
                eff / bw
            );
        }
        if eng.backend() == ds4_engine::Backend::Cuda {
            let cfg = eng.cfg().clone();
            let bpt = eng.stage.w.decode_bytes(cfg.n_expert_used, f / 4 > cfg.idx_topk) as f64;
            let eff = bpt * st.gen_tps() / 1e9;
            eprintln!(
                "ctx {f}: decode reads {:.1} MiB of weights per token; {:.2} t/s = {eff:.1} GB/s = {:.3} of {:.0} GB/s",
                bpt / (1u64 << 20) as f64,
                st.gen_tps(),
                eff / a.gpu_bw_gbps,
                a.gpu_bw_gbps
            );
            if let Some(r) = eng.backend_report() {
                eprintln!("ctx {f}: {r}");
            }
        }
        out.flush().map_err(|e| e.to_string())?;
    }
    if let Some(hwm) = peak_rss() {
        let plan = eng.plan.total();
        let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
        if eng.plan.mapped > 0 {
            // GPU backend: the file mapping the weights were uploaded from is part of the RSS (clean page
            // cache, reclaimable) but not of the host plan.
            let own = hwm.saturating_sub(eng.plan.mapped);
            eprintln!(
                "peak RSS {:.3} GiB, of which up to {:.3} GiB mapped weight pages; memory plan {:.3} GiB; plan / (peak - mapped) = {:.3}",
                gib(hwm),
                gib(eng.plan.mapped),
                gib(plan),
                plan as f64 / own.max(1) as f64
            );
        } else {
            eprintln!("peak RSS {:.3} GiB; memory plan {:.3} GiB; plan / peak = {:.3}", gib(hwm), gib(plan), plan as f64 / hwm as f64);
        }
    }
    Ok(())
}

/// Resident-set high-water mark of this process (`VmHWM`), in bytes.
fn peak_rss() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let l = s.lines().find(|l| l.starts_with("VmHWM:"))?;
    Some(l.split_whitespace().nth(1)?.parse::<u64>().ok()? * 1024)
}
