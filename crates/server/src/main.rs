//! `ds4-server`: OpenAI- and Anthropic-compatible HTTP API over one inference worker with live KV reuse.
mod anthropic_messages;
mod app;
mod args;
mod batch_worker;
mod conn_limit;
mod disk;
mod ds4_flags;
mod errors;
mod fields;
mod gen;
mod kv_reuse;
mod logprobs;
mod metrics;
mod models;
mod openai_chat;
mod openai_completions;
mod openai_responses;
mod prompt_bound;
mod request;
mod request_log;
mod route_kv;
mod script;
mod serve;
mod sse;
mod steer_policy;
mod tool_choice;
mod forced_call;
mod tools;
mod trace;
mod worker;

use clap::{CommandFactory, FromArgMatches};
use ds4_engine::{resolve_model, Engine, LoadOptions, ModelSource};
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::Duration;

fn main() -> ExitCode {
    let matches = args::Args::command().get_matches();
    let mut args = args::Args::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    if let Err(e) = args.ds4.bind_steering(&matches) {
        eprintln!("ds4-server: {e}");
        return ExitCode::from(2);
    }
    if let Some(b) = args.ds4.backend() {
        args.backend = b.to_string();
    }
    // `auto` and `wgpu` resolved once here: the rest of the start-up reads the backend by its name. A
    // backend this binary was not built with is refused when the model loads (exit 1, naming the
    // cargo feature); an unknown name by `validate` (exit 2).
    if let Ok(b) = ds4_engine::Backend::parse(&args.backend) {
        args.backend = b.name().to_string();
    }
    // Bad flag values are usage errors, as clap's own (exit 2).
    if let Err(e) = args.validate() {
        eprintln!("ds4-server: {e}");
        return ExitCode::from(2);
    }
    // A route's host names, resolved before the listener is bound (a usage error, as for ds4).
    if let Err(e) = args.dist.resolve_hosts() {
        eprintln!("ds4-server: {e}");
        return ExitCode::from(2);
    }
    if let Some(dir) = &args.ds4.chdir {
        if let Err(e) = std::env::set_current_dir(dir) {
            eprintln!("ds4-server: --chdir {}: {e}", dir.display());
            return ExitCode::from(2);
        }
    }
    match run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure::Usage(e)) => {
            eprintln!("ds4-server: {e}");
            ExitCode::from(2)
        }
        Err(Failure::Run(e)) => {
            eprintln!("ds4-server: {e}");
            ExitCode::from(1)
        }
    }
}

/// Why the server stopped: flags that do not fit the model (exit 2, as clap's usage errors) or a
/// failure to start or run (exit 1).
enum Failure {
    Usage(String),
    Run(String),
}

impl From<String> for Failure {
    fn from(e: String) -> Self { Failure::Run(e) }
}

/// The flags checked against the model's metadata before the listener is bound (no weight is read):
/// a coordinator's `--layers` (a usage error) and the `--mtp` file's tensors against the model's shapes
/// (a bad file). Without this both failed only after the server said it was listening.
fn check_against_model(args: &args::Args, path: &std::path::Path) -> Result<(), Failure> {
    let mtp = args.ds4.mtp_options().map_err(Failure::Usage)?;
    if mtp.is_none() && !args.dist.is_coordinator() {
        return Ok(());
    }
    let file = ds4_gguf::GgufFile::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let cfg = ds4_model::Config::from_gguf(&file).map_err(|e| format!("{}: {e}", path.display()))?;
    if args.dist.is_coordinator() {
        ds4_dist::cli::coordinator_range(&args.dist, &cfg).map_err(|e| Failure::Usage(e.to_string()))?;
    }
    if let Some(m) = mtp {
        ds4_model::mtp::check_file(&m.path, &cfg).map_err(|e| format!("--mtp: {e}"))?;
    }
    Ok(())
}

/// Everything that can be checked before loading: the listener is bound and the cache directory is
/// usable before a weight byte is read, so a taken port or a bad `--kv-disk-dir` fails at once. The
/// model then loads on its own thread while HTTP answers (503 until it is ready).
fn run(args: args::Args) -> Result<(), Failure> {
    serve::raise_nofile_limit();
    let script = match &args.test_script {
        Some(p) => {
            eprintln!("ds4-server: WARNING --test-script {}: scripted replies replace sampling for matching requests (test only)", p.display());
            Some(script::Script::load(p)?)
        }
        None => None,
    };
    let trace = match &args.trace {
        Some(p) => Arc::new(trace::Trace::open(p).map_err(|e| format!("--trace {}: {e}", p.display()))?),
        None => Arc::new(trace::Trace::off()),
    };
    let src = resolve_model(args.model.as_deref()).map_err(|e| e.to_string())?;
    if let ModelSource::EmbeddedDefault(p) = &src {
        eprintln!("ds4-server: no -m given and ./ds4flash.gguf not found: using the embedded tiny default model (random weights) {}", p.display());
    }
    check_against_model(&args, src.path())?;
    if let Some(dir) = &args.kv_disk_dir {
        disk::check_dir(dir).map_err(|e| format!("--kv-disk-dir {}: {e}", dir.display()))?;
    }
    // The load options' ranges (--threads, --ctx, --prefill-chunk, sessions held) and the backend's
    // presence in this build, checked before the listener is bound. Before, each of these failed only
    // after the server said it was listening (and the ranges with exit 1). What needs the model file
    // (its metadata, the memory plan) is checked by the loader, while HTTP answers 503 `loading`.
    let opts = load_options(&args)?;
    opts.validate().map_err(|e| match e {
        ds4_engine::EngineError::Invalid(m) => Failure::Usage(m),
        e => Failure::Run(e.to_string()),
    })?;
    let metrics = Arc::new(metrics::Metrics::default());
    let tool_mem = Arc::new(Mutex::new(tools::ToolMemory::new(args.tool_memory_max_ids)));
    let app = Arc::new(app::App::from_args(&args, metrics.clone(), tool_mem.clone(), script));
    let router = app::router(app.clone(), args.max_body_bytes, args.cors);
    let limits = serve::Limits {
        max_connections: args.max_connections,
        header_timeout: Duration::from_secs(args.header_timeout_secs),
        body_timeout: Duration::from_secs(args.body_timeout_secs),
        send_timeout: Duration::from_secs(args.send_timeout_secs),
        max_body: args.max_body_bytes,
    };
    let saves_on_exit = args.kv_disk_dir.is_some();
    let addr = format!("{}:{}", args.bind_host(), args.port);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .thread_name("ds4-http")
        .build()
        .map_err(|e| format!("cannot start the async runtime: {e}"))?;
    let listener = rt.block_on(tokio::net::TcpListener::bind(&addr)).map_err(|e| format!("cannot listen on {addr} (--host/--port): {e}"))?;
    let local = listener.local_addr().map_err(|e| e.to_string())?;
    eprintln!("ds4-server: listening on http://{local} (ctx={}); loading {}", args.ctx, src.path().display());
    let (failed_tx, failed_rx) = tokio::sync::oneshot::channel::<String>();
    {
        let app = app.clone();
        let args = args.clone();
        std::thread::Builder::new()
            .name("ds4-load".into())
            .spawn(move || {
                if let Err(e) = load(&args, opts, src.path(), &app, metrics, tool_mem, trace) {
                    let _ = failed_tx.send(e);
                }
            })
            .map_err(|e| format!("cannot start the loading thread: {e}"))?;
    }
    let served_metrics = app.metrics.clone();
    let served = rt.block_on(async move {
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        // Connections still open a few seconds after the signal (a stream nobody reads) do not hold the exit.
        let serve = serve::run(listener, router, limits, &served_metrics, stop_rx, Duration::from_secs(5));
        tokio::pin!(serve);
        let result = tokio::select! {
            _ = &mut serve => Ok(()),
            _ = shutdown_signal() => {
                eprintln!("ds4-server: shutting down");
                Ok(())
            }
            Ok(e) = failed_rx => Err(e),
        };
        let _ = stop_tx.send(true);
        serve.await;
        result
    });
    // The grace is over: the connections still open (streams still being read, requests still queued)
    // are closed now, so their generations stop within a token and queued ones are skipped. Without
    // this their tasks kept running while the shutdown save below waited for every one of them to
    // finish (up to its 60 s), and a long generation left the exit unsaved.
    rt.shutdown_timeout(Duration::from_secs(1));
    if saves_on_exit {
        // Clean exit: the live session goes to the disk KV cache (after the job in progress, if any).
        if let Some(r) = app.ready.get() {
            if !r.submitter.shutdown(Duration::from_secs(60)) {
                eprintln!("ds4-server: WARNING the live session was not saved to the KV disk cache before exit");
            }
        }
    }
    served.map_err(Failure::Run)
}

/// The engine's load options from the flags.
fn load_options(args: &args::Args) -> Result<LoadOptions, String> {
    let backend = ds4_engine::Backend::parse(&args.backend).map_err(|e| e.to_string())?;
    let mut opts = LoadOptions { ctx: args.ctx, threads: args.threads, mem_limit_gb: args.mem_limit_gb, backend, cuda_devices: args.cuda_devices.clone(), cuda_weights: ds4_engine::CudaWeights::parse(&args.cuda_weights).map_err(|e| e.to_string())?, debug: args.debug, weights: args.weights, warm_weights: args.warm_weights, kv_states: kv_states(args), batch_slots: args.batched_session, deterministic: args.deterministic, mtp: args.ds4.mtp_options()?, steering: args.ds4.steering.clone(), ..LoadOptions::default() }.chunk_flag(args.prefill_chunk);
    if args.ds4.quality {
        // As ds4's --quality: exact kernels (f32 activations) instead of the int8-activation fast path.
        opts.options.precision = ds4_quant::Precision::Exact;
    }
    // Diagnostic only: `--qat off` drops the FP8/FP4 simulation (not the shipped numerics).
    opts.options.qat = args.ds4.qat != "off";
    Ok(opts)
}

/// Loads the model (or starts the distributed route), opens the disk cache, starts the inference
/// worker, and marks the server ready.
fn load(
    args: &args::Args,
    opts: LoadOptions,
    path: &std::path::Path,
    app: &app::App,
    metrics: Arc<metrics::Metrics>,
    tool_mem: Arc<Mutex<tools::ToolMemory>>,
    trace: Arc<trace::Trace>,
) -> Result<(), String> {
    let backend = opts.backend;
    app.set_loading("loading model weights");
    let t0 = std::time::Instant::now();
    let (model, tok, coordinator, model_id) = if args.dist.is_coordinator() {
        // Requests are served as soon as the local layers are loaded; until the route is complete they
        // fail with the missing layer (503) and /health says what is missing.
        let setup = ds4_dist::cli::start_coordinator(&args.dist, path, &opts, None).map_err(|e| format!("{}: {e}", path.display()))?;
        let tok = setup.tokenizer.clone().ok_or_else(|| format!("{}: the model file carries no tokenizer", path.display()))?;
        let coord = setup.coordinator.clone();
        let id = models::model_id(&setup.cfg);
        let route = route_kv::RouteKv { session: setup.session, n_vocab: setup.cfg.n_vocab };
        (worker::Model::Route(route), tok, Some(coord), id)
    } else {
        let engine = Engine::load(path, &opts).map_err(|e| {
            let hint = match e {
                ds4_engine::EngineError::Budget(_) if args.batched_session > 1 => {
                    format!(" (the plan holds {} KV states: --batched-session {} x (1 + --kv-snapshots); fewer sessions or snapshots need less memory)", opts.kv_states, args.batched_session)
                }
                _ => String::new(),
            };
            format!("{}: {e}{hint}", path.display())
        })?;
        let tok = engine.tokenizer().map_err(|e| e.to_string())?;
        let id = models::model_id(engine.cfg());
        (worker::Model::Local(engine), tok, None, id)
    };
    tok.chat_ids().map_err(|e| format!("{}: {e}", path.display()))?;
    let disk = match (&args.kv_disk_dir, &model) {
        (Some(dir), worker::Model::Local(engine)) => {
            let model = ds4_kvstore::stage_identity(&engine.stage);
            let budget = (args.kv_disk_space_mb * (1u64 << 20) as f64) as u64;
            let store = ds4_kvstore::KvStore::open(dir, budget, model).map_err(|e| format!("--kv-disk-dir {}: {e}", dir.display()))?;
            let policy = disk::SavePolicy::from_args(args);
            eprintln!("ds4-server: KV disk cache {} (budget={budget} bytes, {policy})", dir.display());
            Some(disk::DiskCache::new(store, policy, metrics.clone(), tool_mem.clone()))
        }
        _ => None,
    };
    // Rewinds restore host KV snapshots; with a GPU backend the state lives on the device.
    let snapshots = if backend.is_gpu() && args.kv_snapshots > 0 {
        eprintln!("ds4-server: KV snapshots (rewinds to a common prefix) are off with --backend {}; a new conversation prefills from the start", args.backend);
        0
    } else {
        args.kv_snapshots
    };
    // The engine's chunk (on a GPU without --prefill-chunk, the largest that fits).
    let prefill_chunk = match &model {
        worker::Model::Local(engine) => engine.prefill_chunk,
        _ => opts.prefill_chunk,
    };
    let wcfg = worker::WorkerConfig { snapshots, prefill_chunk, exact_tool_replay: !args.disable_exact_dsml_tool_replay, disk, quiet: args.quiet, batched: args.batched_session, steer: args.ds4.steer_policy(), power: args.ds4.power, quantum: args.ds4.mixed_prefill_quantum };
    let max_token_bytes = tok.max_token_bytes();
    let submitter = worker::spawn(model, tok.clone(), wcfg, args.max_queue, metrics, tool_mem, trace).map_err(|e| format!("cannot start the inference worker: {e}"))?;
    let ready = app::Ready { model_id: model_id.to_string(), tok, max_token_bytes, submitter, coordinator };
    if app.ready.set(ready).is_err() {
        return Err("the model was loaded twice".into());
    }
    eprintln!("ds4-server: ready: {model_id} loaded in {:.1}s", t0.elapsed().as_secs_f64());
    Ok(())
}

/// KV states the server can hold at once, for the memory plan: every session (`--batched-session`) and
/// its rewind snapshots (kept on the CPU backend only).
fn kv_states(args: &args::Args) -> usize {
    // Saturating: `--kv-snapshots 18446744073709551615` wrapped to 0 states, so the memory plan counted
    // no KV at all and the range check passed.
    args.batched_session.saturating_mul(1usize.saturating_add(if args.backend != "cpu" { 0 } else { args.kv_snapshots }))
}

/// SIGINT (Ctrl-C) or SIGTERM.
async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}
