//! `ds4-server`: OpenAI- and Anthropic-compatible HTTP API over one inference worker with live KV reuse.
mod anthropic_messages;
mod app;
mod args;
mod disk;
mod errors;
mod fields;
mod kv_reuse;
mod metrics;
mod models;
mod openai_chat;
mod openai_completions;
mod openai_responses;
mod request;
mod route_kv;
mod script;
mod sse;
mod tools;
mod trace;
mod worker;

use clap::Parser;
use ds4_engine::{resolve_model, Engine, LoadOptions, ModelSource};
use std::process::ExitCode;
use std::sync::{Arc, Mutex};

fn main() -> ExitCode {
    let args = args::Args::parse();
    // Bad flag values are usage errors, as clap's own (exit 2).
    if let Err(e) = args.validate() {
        eprintln!("ds4-server: {e}");
        return ExitCode::from(2);
    }
    match run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ds4-server: {e}");
            ExitCode::from(1)
        }
    }
}

fn run(args: args::Args) -> Result<(), String> {
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
    let backend = ds4_engine::Backend::parse(&args.backend).map_err(|e| e.to_string())?;
    let opts = LoadOptions { ctx: args.ctx, threads: args.threads, prefill_chunk: args.prefill_chunk, mem_limit_gb: args.mem_limit_gb, backend, cuda_devices: args.cuda_devices.clone(), cuda_weights: ds4_engine::CudaWeights::parse(&args.cuda_weights).map_err(|e| e.to_string())?, debug: args.debug, weights: args.weights, warm_weights: args.warm_weights, kv_states: kv_states(&args), ..LoadOptions::default() };
    let (model, tok, coordinator) = if args.dist.is_coordinator() {
        // Requests are served as soon as HTTP is up; until the route is complete they fail with the
        // missing layer (503) and /health says what is missing.
        let setup = ds4_dist::cli::start_coordinator(&args.dist, src.path(), &opts, None)
            .map_err(|e| format!("{}: {e}", src.path().display()))?;
        let tok = setup.tokenizer.clone().ok_or_else(|| format!("{}: the model file carries no tokenizer", src.path().display()))?;
        let coord = setup.coordinator.clone();
        let route = route_kv::RouteKv { session: setup.session, n_vocab: setup.cfg.n_vocab };
        (worker::Model::Route(route), tok, Some(coord))
    } else {
        let engine = Engine::load(src.path(), &opts).map_err(|e| format!("{}: {e}", src.path().display()))?;
        let tok = engine.tokenizer().map_err(|e| e.to_string())?;
        (worker::Model::Local(engine), tok, None)
    };
    tok.chat_ids().map_err(|e| format!("{}: {e}", src.path().display()))?;
    let metrics = Arc::new(metrics::Metrics::default());
    let tool_mem = Arc::new(Mutex::new(tools::ToolMemory::new(args.tool_memory_max_ids)));
    let disk = match (&args.kv_disk_dir, &model) {
        (Some(dir), worker::Model::Local(engine)) => {
            let model = ds4_kvstore::stage_identity(&engine.stage);
            let budget = (args.kv_disk_space_mb * (1u64 << 20) as f64) as u64;
            let store = ds4_kvstore::KvStore::open(dir, budget, model).map_err(|e| format!("--kv-disk-dir {}: {e}", dir.display()))?;
            eprintln!("ds4-server: KV disk cache {} (budget={budget} bytes, min={} tokens)", dir.display(), args.kv_disk_min_tokens);
            Some(disk::DiskCache::new(store, args.kv_disk_min_tokens, metrics.clone(), tool_mem.clone()))
        }
        _ => None,
    };
    // Rewinds restore host KV snapshots; with the CUDA backend the state lives on the device.
    let snapshots = if args.backend == "cuda" && args.kv_snapshots > 0 {
        eprintln!("ds4-server: KV snapshots (rewinds to a common prefix) are off with --backend cuda; a new conversation prefills from the start");
        0
    } else {
        args.kv_snapshots
    };
    let wcfg = worker::WorkerConfig { snapshots, prefill_chunk: args.prefill_chunk, exact_tool_replay: !args.disable_exact_dsml_tool_replay, disk };
    let submitter = worker::spawn(model, tok.clone(), wcfg, args.max_queue, metrics.clone(), tool_mem.clone(), trace)
        .map_err(|e| format!("cannot start the inference worker: {e}"))?;
    let mut app = app::App::from_args(&args, tok, submitter, metrics, tool_mem, script);
    app.coordinator = coordinator;
    let app = Arc::new(app);
    let router = app::router(app.clone(), args.max_body_bytes, args.cors);
    let saves_on_exit = args.kv_disk_dir.is_some();
    let addr = format!("{}:{}", args.bind_host(), args.port);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .thread_name("ds4-http")
        .build()
        .map_err(|e| format!("cannot start the async runtime: {e}"))?;
    let served = rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind(&addr).await.map_err(|e| format!("cannot listen on {addr} (--host/--port): {e}"))?;
        let local = listener.local_addr().map_err(|e| e.to_string())?;
        eprintln!("ds4-server: listening on http://{local} (ctx={})", args.ctx);
        let (stop_tx, mut stop_rx) = tokio::sync::watch::channel(false);
        let serve = axum::serve(listener, router).with_graceful_shutdown(async move {
            shutdown_signal().await;
            eprintln!("ds4-server: shutting down");
            let _ = stop_tx.send(true);
        });
        // Connections still open a few seconds after the signal (a stream nobody reads) do not hold the exit.
        let grace = async move {
            let _ = stop_rx.wait_for(|v| *v).await;
            tokio::time::sleep(std::time::Duration::from_secs(5)).await;
        };
        tokio::select! {
            r = serve => r.map_err(|e| format!("server error: {e}")),
            _ = grace => Ok(()),
        }
    });
    if saves_on_exit {
        // Clean exit: the live session goes to the disk KV cache (after the job in progress, if any).
        if !app.submitter.shutdown(std::time::Duration::from_secs(60)) {
            eprintln!("ds4-server: WARNING the live session was not saved to the KV disk cache before exit");
        }
    }
    served
}

/// KV states the server can hold at once, for the memory plan: the live session and its rewind
/// snapshots (kept on the CPU backend only).
fn kv_states(args: &args::Args) -> usize {
    1 + if args.backend == "cuda" { 0 } else { args.kv_snapshots }
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
