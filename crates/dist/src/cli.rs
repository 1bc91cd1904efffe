//! Entry points for the binaries: `ds4 --role worker`, the coordinator set-up shared by `ds4`,
//! `ds4-server` and `ds4-bench`, and `ds4-bench --role coordinator`.
use crate::args::DistArgs;
use crate::coordinator::{CoordConfig, Coordinator};
use crate::error::{DistError, Result};
use crate::exec::LocalStage;
use crate::route::{DistSession, RouteOptions};
use crate::worker::{run_worker, WorkerOptions};
use ds4_engine::{resolve_model, Engine, LoadOptions};
use ds4_model::{Config, LayerRange};
use ds4_tokenizer::Tokenizer;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Exit status for a result: 2 for usage errors, 1 otherwise.
pub fn exit_code(e: &DistError) -> u8 { if matches!(e, DistError::Usage(_)) { 2 } else { 1 } }

/// `ds4 --role worker`: serve a layer slice until killed. `load` says how (context, threads,
/// backend, prefill chunk, memory budget); the layers come from `--layers`.
pub fn worker_main(dist: &DistArgs, model: Option<&Path>, load: &LoadOptions) -> Result<()> {
    dist.validate()?;
    dist.resolve_hosts()?;
    crate::spin::set(dist.spin(load.backend));
    let test_hang_at = test_hang()?;
    let src = resolve_model(model)?;
    let debug = load.debug;
    let opts = WorkerOptions { load: load.clone(), token: dist.dist_token.clone(), timeout: dist.timeout(), debug, test_hang_at, ..WorkerOptions::default() };
    run_worker(src.path(), dist.layers.as_deref().unwrap_or_default(), &dist.coordinator_addr()?, &opts)
}

/// Test only: `DS4_DIST_TEST_HANG=N` blocks the worker's compute thread in its N-th forward request
/// (see [`WorkerOptions::test_hang_at`]); a value that is not a positive integer is a usage error.
fn test_hang() -> Result<Option<u64>> {
    match std::env::var("DS4_DIST_TEST_HANG") {
        Err(_) => Ok(None),
        Ok(v) => match v.trim().parse::<u64>() {
            Ok(n) if n > 0 => Ok(Some(n)),
            _ => Err(DistError::Usage(format!("DS4_DIST_TEST_HANG must be a positive integer (test only), got {v:?}"))),
        },
    }
}

/// A coordinator session: the local layers loaded, the listener up, and (within `wait`) a complete route.
pub struct CoordinatorSetup {
    pub session: DistSession,
    pub coordinator: Arc<Coordinator>,
    pub tokenizer: Option<Arc<Tokenizer>>,
    pub cfg: Config,
}

/// The coordinator's `--layers` against the model (a usage error when they do not parse for it, or
/// leave no layer for a worker that would own the output head). Binaries that can read the model's
/// metadata before loading call it first.
pub fn coordinator_range(dist: &DistArgs, cfg: &Config) -> Result<LayerRange> {
    let range = LayerRange::parse(dist.layers.as_deref().unwrap_or_default(), cfg.n_layer).map_err(|e| DistError::Usage(e.to_string()))?;
    if range.last + 1 == cfg.n_layer && !range.head {
        // No worker can follow (it would start past the last layer), so the route could never complete.
        return Err(DistError::Usage(format!(
            "--layers {}: the coordinator holds every layer but not the output head, and workers own only layers after it; use --layers 0:output, or leave layers to workers",
            range.label()
        )));
    }
    Ok(range)
}

/// `load`: how the local layers are loaded (the layers themselves come from `--layers`, the batch
/// from `--dist-prefill-chunk` when given). `wait`: how long to wait for a complete route (None:
/// return at once; requests made while the route is incomplete fail with the missing layer, as
/// after a worker failure).
pub fn start_coordinator(dist: &DistArgs, model: &Path, load: &LoadOptions, wait: Option<Duration>) -> Result<CoordinatorSetup> {
    dist.validate()?;
    if !dist.is_coordinator() {
        return Err(DistError::Usage("start_coordinator needs --role coordinator".into()));
    }
    dist.resolve_hosts()?;
    crate::spin::set(dist.spin(load.backend));
    let file = Arc::new(ds4_gguf::GgufFile::open(model).map_err(|e| DistError::Model(format!("{}: {e}", model.display())))?);
    let cfg = Config::from_gguf(&file)?;
    let range = coordinator_range(dist, &cfg)?;
    // --dist-prefill-chunk sizes the engine's batch; without it (and without --prefill-chunk) a GPU
    // takes the largest chunk that fits, and the route prefills in chunks of at most that.
    let given = dist.dist_prefill_chunk.or((!load.auto_chunk).then_some(load.prefill_chunk));
    let debug = load.debug;
    let eng = Engine::load(model, &LoadOptions { layers: Some(range), prefill_chunk: given.unwrap_or(load.prefill_chunk).max(1), auto_chunk: given.is_none(), ..load.clone() })?;
    let chunk = eng.prefill_chunk.max(1);
    let (tokenizer, ctx) = (eng.tokenizer.clone(), eng.ctx);
    let coord = Arc::new(Coordinator::start(CoordConfig {
        listen: dist.listen_addr()?,
        file,
        cfg: cfg.clone(),
        local: range,
        ctx,
        bits: dist.bits(),
        token: dist.dist_token.clone(),
        timeout: dist.timeout(),
        max_chunk: chunk,
        debug,
    })?);
    let opts = RouteOptions {
        bits: dist.bits(),
        prefill_bits: Some(dist.prefill_bits()),
        prefill_chunk: chunk,
        auto_chunk: dist.dist_prefill_chunk.is_none(),
        prefill_window: dist.dist_prefill_window,
        replay_check: dist.dist_replay_check,
        debug,
    };
    let session = DistSession::new(LocalStage::from_engine(eng), Some(coord.clone()), opts);
    if let (Some(wait), Err(_)) = (wait, coord.plan()) {
        eprintln!("ds4: distributed coordinator: waiting up to {:.0}s for workers", wait.as_secs_f64());
        coord.wait_complete(wait)?;
    }
    Ok(CoordinatorSetup { session, coordinator: coord, tokenizer, cfg })
}

/// How long a coordinator binary waits for a complete route at start (`DS4_DIST_WAIT_S`, default 300 s).
pub fn wait_default() -> Duration {
    Duration::from_secs_f64(std::env::var("DS4_DIST_WAIT_S").ok().and_then(|v| v.parse().ok()).unwrap_or(300.0))
}

/// What `ds4-bench` hands over in coordinator mode.
pub struct BenchRun<'a> {
    pub model: Option<&'a Path>,
    pub prompt_file: PathBuf,
    pub frontiers: Vec<usize>,
    pub gen_tokens: usize,
    /// Threads, backend, prefill chunk, memory budget, debug (the context is sized from the frontiers).
    pub load: LoadOptions,
    pub csv: Option<PathBuf>,
}

/// `ds4-bench --role coordinator`: the frontier CSV over the route. Remote KV cannot be snapshotted,
/// so each frontier prefills from 0 (prefill_tokens says so) and decodes greedily at the last stage.
pub fn bench_main(dist: &DistArgs, b: &BenchRun) -> Result<()> {
    dist.validate()?;
    if !dist.is_coordinator() {
        return Err(DistError::Usage("ds4-bench takes --role coordinator (workers run `ds4 --role worker`)".into()));
    }
    let max = *b.frontiers.iter().max().ok_or_else(|| DistError::Usage("no context frontiers".into()))?;
    let text = std::fs::read_to_string(&b.prompt_file).map_err(|e| DistError::Usage(format!("cannot read {}: {e}", b.prompt_file.display())))?;
    let src = resolve_model(b.model)?;
    let ctx = max + b.gen_tokens + 1;
    let mut setup = start_coordinator(dist, src.path(), &LoadOptions { ctx, ..b.load.clone() }, Some(wait_default()))?;
    let tok = setup.tokenizer.clone().ok_or_else(|| DistError::Model("the model file carries no tokenizer".into()))?;
    let base = tok.encode(&text);
    if base.is_empty() {
        return Err(DistError::Usage("the prompt file has no tokens".into()));
    }
    let toks: Vec<u32> = base.iter().cycle().take(max).copied().collect();
    let mut out: Box<dyn Write> = match &b.csv {
        Some(p) => Box::new(std::fs::File::create(p).map_err(|e| DistError::Other(format!("cannot create {}: {e}", p.display())))?),
        None => Box::new(std::io::stdout()),
    };
    let w = |out: &mut Box<dyn Write>, s: String| writeln!(out, "{s}").and_then(|_| out.flush()).map_err(|e| DistError::Io(e.to_string()));
    w(&mut out, "ctx_tokens,prefill_tokens,prefill_tps,gen_tokens,gen_tps,kvcache_bytes".into())?;
    let s = &mut setup.session;
    for &f in &b.frontiers {
        s.reset();
        let t0 = Instant::now();
        let l = s.sync(&toks[..f])?;
        let mut next = ds4_tokenizer::sampling::argmax(l);
        let pt = t0.elapsed().as_secs_f64();
        let t1 = Instant::now();
        let mut ids = Vec::with_capacity(b.gen_tokens);
        for _ in 0..b.gen_tokens {
            ids.push(next);
            next = s.step_greedy(next, 0)?.id;
        }
        let gt = t1.elapsed().as_secs_f64();
        if b.load.debug {
            // Same line as the single-process ds4-bench: the two runs' tokens can be compared.
            eprintln!("ctx {f}: greedy token ids {ids:?}");
        }
        w(&mut out, format!("{f},{f},{:.2},{},{:.2},0", f as f64 / pt, b.gen_tokens, b.gen_tokens as f64 / gt.max(1e-9)))?;
    }
    Ok(())
}
