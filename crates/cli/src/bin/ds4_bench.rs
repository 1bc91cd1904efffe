//! `ds4-bench`: prefill and decode throughput at growing context frontiers, as CSV
//! (`ctx_tokens,prefill_tokens,prefill_tps,gen_tokens,gen_tps,kvcache_bytes`).
//! Method: prefill incrementally to each frontier, snapshot the KV state, generate greedily, restore.
use clap::Parser;
use ds4_engine::{resolve_model, Engine, GenStats, LoadOptions, ModelSource, Session};
use ds4_tokenizer::chat::{render_chat, Message, RenderOptions, ThinkMode};
use ds4_tokenizer::sampling::argmax;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::AtomicBool;
use std::time::Instant;

#[path = "../backend_flags.rs"]
mod backend_flags;
#[path = "../ds4_compat.rs"]
mod ds4_compat;
#[path = "../out_path.rs"]
#[allow(dead_code)] // check_replaced: ds4's --kv-save
mod out_path;
#[path = "../kv_snapshot.rs"]
mod kv_snapshot;

#[derive(Parser, Debug)]
#[command(name = "ds4-bench", about = "DwarfStar throughput benchmark over context frontiers (CSV on stdout)", version, args_override_self = true,
    after_help = "The C engine's flags are accepted; those of features not built here (--dspark, --ssd-streaming, ...) exit 2 with a line saying so. Table: README.md, section 'Flags: from ds4 to DwarfStar'")]
#[command(group = clap::ArgGroup::new("input").required(true).args(["prompt_file", "chat_prompt_file"]))]
struct Args {
    #[arg(short = 'm', long = "model")]
    model: Option<PathBuf>,
    /// Raw text whose tokens fill the context (repeated if shorter than --ctx-max).
    #[arg(long = "prompt-file")]
    prompt_file: Option<PathBuf>,
    /// Text rendered as one non-thinking chat user message (with -sys/--system), then as --prompt-file.
    #[arg(long = "chat-prompt-file")]
    chat_prompt_file: Option<PathBuf>,
    /// System prompt for --chat-prompt-file (ds4's -sys).
    #[arg(long = "system", requires = "chat_prompt_file")]
    system: Option<String>,
    /// First measured frontier.
    #[arg(long = "ctx-start", default_value_t = 2048, allow_negative_numbers = true)]
    ctx_start: usize,
    /// Last frontier (always measured, also when the step jumps past it).
    #[arg(long = "ctx-max", default_value_t = 32768, allow_negative_numbers = true)]
    ctx_max: usize,
    /// Linear frontier step, used when --step-mul is 1 [default: 2048].
    #[arg(long = "step-incr", allow_negative_numbers = true)]
    step_incr: Option<usize>,
    /// Multiplicative frontier step: when not 1, next = ceil(current × F).
    #[arg(long = "step-mul", default_value_t = 1.0, allow_negative_numbers = true)]
    step_mul: f64,
    /// Context size to allocate (default: --ctx-max + --gen-tokens + 1).
    #[arg(long = "ctx-alloc", short = 'c', visible_alias = "ctx", allow_negative_numbers = true)]
    ctx: Option<usize>,
    /// Greedy tokens decoded at each frontier (0: prefill only).
    #[arg(long = "gen-tokens", short = 'n', visible_alias = "tokens", default_value_t = 128, allow_negative_numbers = true)]
    gen_tokens: usize,
    #[arg(short = 't', long = "threads", allow_negative_numbers = true)]
    threads: Option<usize>,
    /// Prompt tokens per prefill batch (sizes the prefill working memory). Default: on a GPU the largest
    /// of 4096, 2048, 1024, 512, 256 that fits beside the weights (ds4: 2048-4096); 256 on the CPU.
    #[arg(long = "prefill-chunk", allow_negative_numbers = true)]
    prefill_chunk: Option<usize>,
    /// Memory budget in GiB (default: the RAM available now); a plan over it refuses to start.
    #[arg(long = "mem-limit-gb", allow_negative_numbers = true)]
    mem_limit_gb: Option<f64>,
    /// Also measure this machine's read bandwidth and report decode as a fraction of it (stderr).
    #[arg(long = "bandwidth")]
    bandwidth: bool,
    /// Write the CSV here instead of stdout.
    #[arg(long = "csv")]
    csv: Option<PathBuf>,
    /// With a GPU backend (cuda, vulkan, metal): report decode as a fraction of this memory bandwidth (GB/s).
    #[arg(long = "gpu-bw-gbps", default_value_t = 4800.0, allow_negative_numbers = true)]
    gpu_bw_gbps: f64,
    /// Verbose diagnostics (distributed per-hop telemetry) on stderr.
    #[arg(long = "debug")]
    debug: bool,
    /// Decode N streams together (batched decode; CPU, or cuda/vulkan/metal with one device KV slot per
    /// stream): each stream has its own KV state and its own text (the prompt rotated), all at the
    /// frontier; the CSV gains `streams,aggregate_gen_tps,per_stream_gen_tps` (gen_tps stays the
    /// single-stream rate of stream 0 measured alone).
    #[arg(long = "concurrency", value_name = "N", default_value_t = 1, allow_negative_numbers = true)]
    concurrency: usize,
    /// With --concurrency N > 8 on CUDA: every row of every batch is computed as its stream's own
    /// one-token step (bit-identical to decoding it alone). Batches of up to 8 streams do so anyway
    /// (faster there); larger ones otherwise take the multi-token kernels, which round differently.
    #[arg(long = "deterministic")]
    deterministic: bool,
    /// ds4's flags (backend switches, --quality, --power, --dump-frontier-logits-dir).
    #[command(flatten)]
    ds4: BenchDs4Flags,
    /// Distributed inference (--role coordinator, --layers, --listen, --dist-*).
    #[command(flatten)]
    dist: ds4_dist::DistArgs,
}

/// Flags with the C engine's ds4-bench spelling and meaning.
#[derive(clap::Args, Debug)]
struct BenchDs4Flags {
    #[command(flatten)]
    sw: backend_flags::EngineSwitches,
    /// Write the last position's logits at each frontier: DIR/ctx-N.logits.f32 (little-endian f32 ×
    /// vocab) and DIR/ctx-N.tokens.u32 (the frontier's token ids, little-endian u32).
    #[arg(long = "dump-frontier-logits-dir")]
    dump_frontier_logits_dir: Option<PathBuf>,
}

fn main() -> ExitCode {
    let a: Args = backend_flags::parse_steered("ds4-bench", ds4_compat::preprocess("ds4-bench", std::env::args_os()), |a: &mut Args| &mut a.ds4.sw.steering);
    match run(a) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ds4-bench: {e}");
            ExitCode::from(1)
        }
    }
}

/// Most frontiers one run measures (each is a prefill and a decode measurement).
const MAX_FRONTIERS: usize = 1 << 16;

/// Context frontiers from --ctx-start to --ctx-max; --ctx-max is always the last one, also when the
/// step jumps past it (as ds4-bench).
fn frontiers(a: &Args) -> Result<Vec<usize>, String> {
    if a.ctx_start == 0 || a.ctx_start > a.ctx_max {
        return Err(usage("need 0 < --ctx-start <= --ctx-max"));
    }
    // Also bounds the frontier list (one entry per step up to --ctx-max).
    if a.ctx_max > ds4_engine::MAX_CTX {
        return Err(usage(&format!("--ctx-max {}: at most {} tokens", a.ctx_max, ds4_engine::MAX_CTX)));
    }
    let linear = a.step_mul == 1.0;
    if !linear && a.step_incr.is_some() {
        return Err(usage("--step-incr applies only with --step-mul 1: give one of them"));
    }
    let geometric = a.step_mul > 1.0 && a.step_mul.is_finite();
    if !linear && !geometric {
        return Err(usage("--step-mul must be 1 (linear steps) or greater than 1"));
    }
    let incr = a.step_incr.unwrap_or(2048);
    if incr == 0 {
        return Err(usage("--step-incr must be positive"));
    }
    let mut v = vec![a.ctx_start];
    loop {
        let cur = *v.last().unwrap();
        if cur >= a.ctx_max {
            break;
        }
        if v.len() == MAX_FRONTIERS {
            return Err(usage(&format!("--ctx-start {} to --ctx-max {} gives more than {MAX_FRONTIERS} frontiers: use a larger --step-incr or --step-mul", a.ctx_start, a.ctx_max)));
        }
        let next = if linear { cur.saturating_add(incr) } else { ((cur as f64) * a.step_mul).ceil() as usize };
        v.push(next.max(cur + 1).min(a.ctx_max));
    }
    Ok(v)
}

/// A usage error: printed and exit 2, as clap's.
fn usage(msg: &str) -> String {
    eprintln!("ds4-bench: {msg}");
    std::process::exit(2)
}

/// The benchmark's token sequence: the raw text, or the text as one non-thinking chat user turn.
fn bench_tokens(a: &Args, tok: &ds4_tokenizer::Tokenizer) -> Result<Vec<u32>, String> {
    let (path, chat) = match (&a.prompt_file, &a.chat_prompt_file) {
        (Some(p), _) => (p, false),
        (None, Some(p)) => (p, true),
        (None, None) => unreachable!("clap requires one of them"),
    };
    let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    if !chat {
        return Ok(tok.encode(&text));
    }
    let mut msgs = Vec::new();
    if let Some(s) = a.system.as_deref().filter(|s| !s.is_empty()) {
        msgs.push(Message::system(s));
    }
    msgs.push(Message::user(text));
    let opts = RenderOptions { mode: ThinkMode::None, ..RenderOptions::default() };
    Ok(tok.encode(&render_chat(&msgs, &opts)))
}

/// Writes the frontier's last-position logits and its token ids (--dump-frontier-logits-dir).
fn dump_frontier(dir: &std::path::Path, f: usize, logits: &[f32], tokens: &[u32]) -> Result<(), String> {
    let le = |v: &mut Vec<u8>, b: [u8; 4]| v.extend_from_slice(&b);
    let mut l = Vec::with_capacity(logits.len() * 4);
    logits.iter().for_each(|x| le(&mut l, x.to_le_bytes()));
    let mut t = Vec::with_capacity(tokens.len() * 4);
    tokens.iter().for_each(|x| le(&mut t, x.to_le_bytes()));
    for (name, bytes) in [(format!("ctx-{f}.logits.f32"), l), (format!("ctx-{f}.tokens.u32"), t)] {
        let p = dir.join(name);
        std::fs::write(&p, bytes).map_err(|e| format!("cannot write {}: {e}", p.display()))?;
    }
    Ok(())
}

fn run(a: Args) -> Result<(), String> {
    if a.prefill_chunk == Some(0) {
        return Err(usage("--prefill-chunk must be at least 1"));
    }
    let fr = frontiers(&a)?;
    if !(a.gpu_bw_gbps > 0.0 && a.gpu_bw_gbps.is_finite()) {
        return Err(usage(&format!("--gpu-bw-gbps must be a positive number of GB/s, got {}", a.gpu_bw_gbps)));
    }
    if a.concurrency == 0 || a.concurrency > ds4_engine::MAX_SESSIONS {
        return Err(usage(&format!("--concurrency must be within 1..={}", ds4_engine::MAX_SESSIONS)));
    }
    // The allocated context: the last frontier and the decoded tokens (checked: no wrap-around to a
    // small context for huge values).
    let Some(need) = a.ctx_max.checked_add(a.gen_tokens).and_then(|n| n.checked_add(1)).filter(|&n| n <= ds4_engine::MAX_CTX) else {
        return Err(usage(&format!("--ctx-max {} + --gen-tokens {} + 1 exceeds the largest context, {} tokens", a.ctx_max, a.gen_tokens, ds4_engine::MAX_CTX)));
    };
    let backend = a.ds4.sw.resolve_backend().map_err(|e| usage(&e.0))?;
    let mut power = ds4_engine::power::Power::new(a.ds4.sw.power).map_err(|e| usage(&e))?;
    let load = LoadOptions { threads: a.threads, mem_limit_gb: a.mem_limit_gb, debug: a.debug, ..a.ds4.sw.load_options(backend) }.chunk_flag(a.prefill_chunk);
    if a.concurrency > 1 && (a.dist.active() || a.ds4.dump_frontier_logits_dir.is_some()) {
        return Err(usage("--concurrency > 1 is not available with --role coordinator or --dump-frontier-logits-dir"));
    }
    let mtp = a.ds4.sw.mtp.options().map_err(|e| usage(&e))?;
    if mtp.is_some() {
        if a.dist.active() {
            return Err(usage("--mtp is not available with --role: the drafter needs the embedding and the output head beside it and drafts are not carried between stages"));
        }
        if a.concurrency > 1 {
            return Err(usage("--mtp with --concurrency > 1: batched decode does not draft; use one or the other"));
        }
        backend.speculative(a.ds4.sw.cuda_devices.len()).map_err(|e| usage(&e))?;
    }
    if let Err(e) = load.validate() {
        eprintln!("ds4-bench: {e}");
        std::process::exit(2);
    }
    if a.dist.active() || a.dist.validate().is_err() {
        let prompt_file = match (&a.prompt_file, a.ds4.dump_frontier_logits_dir.is_some(), a.ds4.sw.power) {
            (Some(p), false, 100) => p.clone(),
            _ => return Err(usage("with --role coordinator: only --prompt-file (no --chat-prompt-file, --dump-frontier-logits-dir or --power) yet")),
        };
        let b = ds4_dist::cli::BenchRun { model: a.model.as_deref(), prompt_file, frontiers: fr, gen_tokens: a.gen_tokens, load, csv: a.csv.clone() };
        return ds4_dist::cli::bench_main(&a.dist, &b).map_err(|e| std::process::exit({ eprintln!("ds4-bench: {e}"); ds4_dist::cli::exit_code(&e) as i32 }));
    }
    for p in a.prompt_file.iter().chain(&a.chat_prompt_file) {
        std::fs::metadata(p).map_err(|e| format!("cannot read {}: {e}", p.display()))?;
    }
    if let Some(d) = &a.ds4.dump_frontier_logits_dir {
        std::fs::create_dir_all(d).map_err(|e| format!("cannot create {}: {e}", d.display()))?;
    }
    // The CSV destination is checked before the weights load (it is created once they have).
    if let Some(p) = &a.csv {
        out_path::check_output(p).map_err(|e| usage(&format!("--csv {e}")))?;
    }
    let src = resolve_model(a.model.as_deref()).map_err(|e| e.to_string())?;
    if let ModelSource::EmbeddedDefault(p) = &src {
        eprintln!("ds4-bench: using the embedded tiny default model {}", p.display());
    }
    let ctx = a.ctx.unwrap_or(need);
    if ctx < need {
        return Err(format!("--ctx-alloc {ctx} is smaller than --ctx-max + --gen-tokens + 1 = {need}"));
    }
    let opts = LoadOptions { ctx, debug: false, kv_states: a.concurrency, batch_slots: a.concurrency, deterministic: a.deterministic, ..load };
    let mut eng = Engine::load(src.path(), &opts).map_err(|e| format!("{}: {e}", src.path().display()))?;
    if let Some(r) = eng.backend_report() {
        eprintln!("after load: {r}");
    }
    let tok = eng.tokenizer().map_err(|e| e.to_string())?;
    let base = bench_tokens(&a, &tok)?;
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
    // A failed CSV write (a full disk) names its destination.
    let dest = a.csv.as_ref().map_or("stdout".to_string(), |p| p.display().to_string());
    let csv_err = |e: std::io::Error| format!("cannot write the CSV to {dest}: {e}");
    let extra = if a.concurrency > 1 { ",streams,aggregate_gen_tps,per_stream_gen_tps" } else if mtp.is_some() { ",mtp_drafted,mtp_accepted,mtp_acceptance" } else { "" };
    writeln!(out, "ctx_tokens,prefill_tokens,prefill_tps,gen_tokens,gen_tps,kvcache_bytes{extra}").map_err(&csv_err)?;
    // The other streams of --concurrency: the same text rotated, so their routing and attention differ.
    let mut others: Vec<(Session, Vec<u32>)> = (1..a.concurrency)
        .map(|j| {
            let r = (j * base.len() / a.concurrency.max(1)).max(j) % base.len().max(1);
            let t: Vec<u32> = base[r..].iter().chain(&base[..r]).cycle().take(a.ctx_max).copied().collect();
            // Stream j in device KV slot j on a GPU backend (stream 0 is slot 0).
            let mut o = Session::new(&eng);
            o.kv.slot = j;
            (o, t)
        })
        .collect();
    let mut s = Session::new(&eng);
    let never = AtomicBool::new(false);
    let mut done = 0;
    for &f in &fr {
        let t0 = Instant::now();
        power.restart();
        let n = s.sync(&mut eng, &toks[..f], &mut |_, _| power.tick(), &never).map_err(|e| e.to_string())?;
        let pt = t0.elapsed().as_secs_f64();
        let profiled = match eng.backend() {
            ds4_engine::Backend::Cuda => std::env::var_os("DS4_CUDA_PROFILE").is_some(),
            b => b.is_gpu() && std::env::var_os("DS4_WGPU_PROFILE").is_some(),
        };
        if profiled {
            // Separate prefill and decode kernel profiles.
            if let Some(r) = eng.backend_report() {
                eprintln!("ctx {f} prefill: {r}");
            }
        }
        debug_assert_eq!(n, f - done);
        done = f;
        let kv_bytes = kv_snapshot::snapshot_bytes(eng.cfg(), f);
        if let Some(d) = &a.ds4.dump_frontier_logits_dir {
            dump_frontier(d, f, &s.logits, &s.tokens)?;
        }
        let mut st = GenStats::default();
        if a.gen_tokens > 0 {
            let snap = s.snapshot();
            let mut ids = Vec::new();
            power.restart();
            if s.speculative() {
                // Greedy with MTP drafts: the same tokens as plain greedy.
                let mut greedy = ds4_tokenizer::sampling::Sampler::new(ds4_tokenizer::sampling::SamplerConfig::greedy());
                s.generate_speculative(&mut eng, a.gen_tokens, None, &mut greedy, &mut |t| { ids.push(t); power.tick(); true }, &never, &mut st).map_err(|e| e.to_string())?;
            } else {
                s.generate(&mut eng, a.gen_tokens, None, true, &mut |l| argmax(l), &mut |t| { ids.push(t); power.tick(); true }, &never, &mut st).map_err(|e| e.to_string())?;
            }
            if a.debug {
                // For comparing runs (e.g. a distributed route against this single process).
                eprintln!("ctx {f}: greedy token ids {ids:?}");
                if s.speculative() {
                    eprintln!("ctx {f}: mtp drafted {} accepted {} (acceptance {:.3})", st.drafted, st.accepted, st.acceptance());
                }
            }
            s.restore(snap);
        }
        write!(out, "{f},{n},{:.2},{},{:.2},{kv_bytes}", n as f64 / pt, st.gen_tokens, st.gen_tps()).map_err(&csv_err)?;
        if a.concurrency > 1 {
            for (o, t) in others.iter_mut() {
                o.sync(&mut eng, &t[..f], &mut |_, _| {}, &never).map_err(|e| e.to_string())?;
            }
            let agg = batched_decode(&mut eng, &s, &others, a.gen_tokens)?;
            write!(out, ",{},{agg:.2},{:.2}", a.concurrency, agg / a.concurrency as f64).map_err(&csv_err)?;
        } else if mtp.is_some() {
            write!(out, ",{},{},{:.4}", st.drafted, st.accepted, st.acceptance()).map_err(&csv_err)?;
        }
        writeln!(out).map_err(&csv_err)?;
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
        if eng.backend().is_gpu() {
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
        out.flush().map_err(&csv_err)?;
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

/// Decodes `gen` greedy tokens for stream 0 (`first`) and `others` together, one batched step per token,
/// on copies of their states; returns the aggregate rate (tokens of all streams per second).
fn batched_decode(eng: &mut Engine, first: &Session, others: &[(Session, Vec<u32>)], gen: usize) -> Result<f64, String> {
    let mut kvs: Vec<ds4_model::KvState> = std::iter::once(first).chain(others.iter().map(|o| &o.0)).map(|s| s.kv.clone()).collect();
    let mut next: Vec<u32> = std::iter::once(first).chain(others.iter().map(|o| &o.0)).map(|s| argmax(&s.logits)).collect();
    let v = eng.cfg().n_vocab;
    let t0 = Instant::now();
    for _ in 0..gen {
        let mut refs: Vec<&mut ds4_model::KvState> = kvs.iter_mut().collect();
        let rows = eng.decode_batch(&mut refs, &next).map_err(|e| e.to_string())?;
        for (j, t) in next.iter_mut().enumerate() {
            *t = argmax(&rows[j * v..(j + 1) * v]);
        }
    }
    let dt = t0.elapsed().as_secs_f64();
    Ok(if dt > 0.0 { (gen * kvs.len()) as f64 / dt } else { 0.0 })
}

/// Resident-set high-water mark of this process (`VmHWM`), in bytes.
fn peak_rss() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let l = s.lines().find(|l| l.starts_with("VmHWM:"))?;
    Some(l.split_whitespace().nth(1)?.parse::<u64>().ok()? * 1024)
}
