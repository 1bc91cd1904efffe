//! `ds4`: one-shot generation (`-p`, `--prompt-file`) and interactive multi-turn chat, on this
//! process's engine or, with `--role coordinator`, on a distributed route (`--role worker` serves a
//! layer slice instead).
use clap::Parser;
use ds4_dist::cli::CoordinatorSetup;
use ds4_engine::{resolve_model, Engine, GenStats, LoadOptions, ModelSource, Session, StopReason};
use ds4_tokenizer::chat::{render_chat, Message, RenderOptions, ThinkMode};
use ds4_tokenizer::sampling::{Sampler, SamplerConfig};
use ds4_tokenizer::{StreamDecoder, Tokenizer};
use indicatif::{ProgressBar, ProgressStyle};
use std::io::{BufRead, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

#[derive(Parser, Debug)]
#[command(name = "ds4", about = "DwarfStar: DeepSeek V4 inference (one-shot or interactive chat)", version)]
struct Args {
    /// Model file (default: ./ds4flash.gguf, else the embedded tiny default model).
    #[arg(short = 'm', long = "model")]
    model: Option<PathBuf>,
    /// Prompt for one-shot mode; without -p/--prompt-file an interactive chat starts.
    #[arg(short = 'p', long = "prompt")]
    prompt: Option<String>,
    /// Read the one-shot prompt from a file.
    #[arg(long = "prompt-file", conflicts_with = "prompt")]
    prompt_file: Option<PathBuf>,
    /// Context size in tokens.
    #[arg(short = 'c', long = "ctx", default_value_t = 32768)]
    ctx: usize,
    /// Maximum tokens to generate per answer.
    #[arg(short = 'n', long = "tokens", default_value_t = 512)]
    tokens: usize,
    /// Sampling temperature (0 = greedy).
    #[arg(long = "temp", default_value_t = 1.0)]
    temp: f32,
    #[arg(long = "top-k", default_value_t = 0)]
    top_k: usize,
    #[arg(long = "top-p", default_value_t = 1.0)]
    top_p: f32,
    #[arg(long = "min-p", default_value_t = 0.05)]
    min_p: f32,
    #[arg(long = "seed", default_value_t = 0)]
    seed: u64,
    /// Thinking mode (default).
    #[arg(long = "think", conflicts_with_all = ["nothink", "think_max"])]
    think: bool,
    /// Non-thinking mode.
    #[arg(long = "nothink", conflicts_with = "think_max")]
    nothink: bool,
    /// Think Max (needs --ctx >= 393216, else falls back to thinking).
    #[arg(long = "think-max")]
    think_max: bool,
    /// System prompt.
    #[arg(long = "system")]
    system: Option<String>,
    /// CPU threads (default: all cores).
    #[arg(short = 't', long = "threads")]
    threads: Option<usize>,
    /// Prompt tokens per prefill batch.
    #[arg(long = "prefill-chunk", default_value_t = 256)]
    prefill_chunk: usize,
    /// Memory budget in GiB (default: the RAM available now); a plan over it refuses to start.
    #[arg(long = "mem-limit-gb")]
    mem_limit_gb: Option<f64>,
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
    /// Restore a session saved with --kv-save before the first prompt (it continues that conversation).
    #[arg(long = "kv-load")]
    kv_load: Option<std::path::PathBuf>,
    /// Save the session (KV state, tokens) to FILE on exit.
    #[arg(long = "kv-save")]
    kv_save: Option<std::path::PathBuf>,
    /// Verbose diagnostics on stderr.
    #[arg(long = "debug")]
    debug: bool,
    /// Distributed inference (--role, --layers, --listen, --coordinator, --dist-*).
    #[command(flatten)]
    dist: ds4_dist::DistArgs,
}

fn main() -> ExitCode {
    let args = Args::parse();
    match run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ds4: {e}");
            ExitCode::from(1)
        }
    }
}

fn mode_of(a: &Args) -> ThinkMode {
    if a.nothink {
        ThinkMode::None
    } else if a.think_max {
        ThinkMode::Max
    } else {
        ThinkMode::High
    }
}

fn run(args: Args) -> Result<(), String> {
    if args.prefill_chunk == 0 {
        return Err("--prefill-chunk must be at least 1".into());
    }
    if args.backend == "cuda" && (args.kv_load.is_some() || args.kv_save.is_some()) {
        // The saved file holds the host KV state; with the CUDA backend the state lives on the GPU.
        return Err("--kv-load/--kv-save are not available with --backend cuda yet (the KV state lives on the GPU)".into());
    }
    if !(args.temp >= 0.0) || !(0.0..=1.0).contains(&args.top_p) || !(0.0..=1.0).contains(&args.min_p) {
        return Err("--temp must be >= 0, --top-p and --min-p within [0, 1]".into());
    }
    let prompt = match (&args.prompt, &args.prompt_file) {
        (Some(p), _) => Some(p.clone()),
        (None, Some(f)) => Some(std::fs::read_to_string(f).map_err(|e| format!("cannot read prompt file {}: {e}", f.display()))?),
        _ => None,
    };
    if args.dist.active() || args.dist.validate().is_err() {
        return distributed(&args, prompt);
    }
    let src = resolve_model(args.model.as_deref()).map_err(|e| e.to_string())?;
    if let ModelSource::EmbeddedDefault(p) = &src {
        eprintln!("ds4: no -m given and ./ds4flash.gguf not found: using the embedded tiny default model (random weights) {}", p.display());
    }
    let t0 = Instant::now();
    let opts = load_options(&args)?;
    if let Err(e) = opts.validate() {
        eprintln!("ds4: {e}");
        std::process::exit(2);
    }
    if let Some(dir) = args.kv_save.as_deref().map(|p| p.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(std::path::Path::new("."))) {
        if !dir.is_dir() {
            return Err(format!("--kv-save: directory {} does not exist", dir.display()));
        }
    }
    let planned = Engine::plan(src.path(), &opts).map_err(|e| format!("{}: {e}", src.path().display()))?;
    if let (Some(p), None) = (&prompt, &args.kv_load) {
        prompt_fits(&args, &planned, p)?;
    }
    let eng = planned.load().map_err(|e| format!("{}: {e}", src.path().display()))?;
    if args.debug {
        let c = eng.cfg();
        eprintln!(
            "ds4: loaded {} in {:.2}s: {} layers, embd {}, vocab {}, {} experts (top {}), threads {}",
            src.path().display(),
            t0.elapsed().as_secs_f64(),
            c.n_layer,
            c.n_embd,
            c.n_vocab,
            c.n_expert,
            c.n_expert_used,
            rayon::current_num_threads()
        );
    }
    let tokenizer = eng.tokenizer().map_err(|e| e.to_string())?;
    let mut session = Session::new(&eng);
    session.prefill_chunk = args.prefill_chunk;
    let kv_id = ds4_kvstore::stage_identity(&eng.stage);
    if let Some(p) = &args.kv_load {
        let s = &mut session;
        match ds4_kvstore::load_file(p, &kv_id, &mut s.kv, &mut s.logits, Some(eng.cfg().n_vocab)) {
            Ok(r) => s.tokens = r.tokens,
            Err(e) => {
                eprintln!("ds4: WARNING --kv-load {}: {e}; starting a new session", p.display());
                s.reset(&eng);
            }
        }
    }
    let mut conv = Local { eng, session, tokenizer };
    let r = converse(&args, &mut conv, prompt);
    if let (Some(p), Ok(())) = (&args.kv_save, &r) {
        let s = &conv.session;
        let st = ds4_kvstore::StateRef { tokens: &s.tokens, kv: &s.kv, logits: &s.logits, tool_map: &[] };
        ds4_kvstore::save_file(p, &kv_id, ds4_kvstore::Reason::Manual, &st).map_err(|e| format!("--kv-save {}: {e}", p.display()))?;
    }
    r
}

/// How the model (or this process's layers of it) is loaded.
fn load_options(args: &Args) -> Result<LoadOptions, String> {
    Ok(LoadOptions {
        ctx: args.ctx,
        threads: args.threads,
        prefill_chunk: args.prefill_chunk,
        mem_limit_gb: args.mem_limit_gb,
        debug: args.debug,
        backend: ds4_engine::Backend::parse(&args.backend).map_err(|e| e.to_string())?,
        cuda_devices: args.cuda_devices.clone(),
        weights: args.weights,
        warm_weights: args.warm_weights,
        ..LoadOptions::default()
    })
}

/// Refuses, before the weights are read, a one-shot prompt whose first turn cannot fit the context.
/// A text longer than `ctx` tokens of the longest vocabulary entry is refused without tokenizing it.
fn prompt_fits(args: &Args, planned: &ds4_engine::LoadPlan, prompt: &str) -> Result<(), String> {
    let ctx = planned.memory.ctx;
    let tok = planned.tokenizer.clone().ok_or("the model file carries no tokenizer")?;
    let longest = (0..tok.n_vocab() as u32).map(|i| tok.token_bytes(i).len()).max().unwrap_or(1).max(1);
    if prompt.len() / longest >= ctx {
        return Err(format!("the prompt has {} bytes, at least {} tokens, which does not fit --ctx {ctx}", prompt.len(), prompt.len() / longest));
    }
    let n = tok.encode(&first_turn(args.system.as_deref(), prompt, mode_of(args), ctx)).len();
    if n >= ctx {
        return Err(format!("prompt has {n} tokens, which does not fit --ctx {ctx}"));
    }
    Ok(())
}

/// The rendered text of a conversation's first turn.
fn first_turn(system: Option<&str>, user: &str, mode: ThinkMode, ctx: usize) -> String {
    let mut msgs = Vec::new();
    if let Some(s) = system {
        msgs.push(Message::system(s.to_string()));
    }
    msgs.push(Message::user(user.to_string()));
    render_chat(&msgs, &RenderOptions { mode, ctx: ctx as u64, ..RenderOptions::default() })
}

/// `--role worker`: serve a layer slice; `--role coordinator`: the chat (one-shot or interactive) on
/// the route. Usage errors exit 2.
fn distributed(args: &Args, prompt: Option<String>) -> Result<(), String> {
    let usage = |e: ds4_dist::DistError| -> String { std::process::exit({ eprintln!("ds4: {e}"); ds4_dist::cli::exit_code(&e) as i32 }) };
    args.dist.validate().map_err(usage)?;
    if args.dist.is_worker() {
        return ds4_dist::cli::worker_main(&args.dist, args.model.as_deref(), &load_options(args)?).map_err(usage);
    }
    if !args.dist.is_coordinator() {
        return Err(usage(ds4_dist::DistError::Usage("--role none: nothing distributed to do".into())));
    }
    for (set, f) in [(args.kv_load.is_some(), "--kv-load"), (args.kv_save.is_some(), "--kv-save")] {
        if set {
            return Err(usage(ds4_dist::DistError::Usage(format!("{f} is not available with --role coordinator"))));
        }
    }
    let src = resolve_model(args.model.as_deref()).map_err(|e| e.to_string())?;
    let wait = Some(ds4_dist::cli::wait_default());
    let setup = ds4_dist::cli::start_coordinator(&args.dist, src.path(), &load_options(args)?, wait).map_err(usage)?;
    let tokenizer = setup.tokenizer.clone().ok_or_else(|| format!("{}: the model file carries no tokenizer", src.path().display()))?;
    converse(args, &mut Route { setup, tokenizer }, prompt)
}

/// One-shot (`prompt`) or interactive chat on `conv`, with Ctrl+C stopping a generation.
fn converse(args: &Args, conv: &mut dyn Conversation, prompt: Option<String>) -> Result<(), String> {
    let cancel = Arc::new(AtomicBool::new(false));
    let generating = Arc::new(AtomicBool::new(false));
    {
        let (c, g) = (cancel.clone(), generating.clone());
        ctrlc::set_handler(move || {
            if g.load(Ordering::SeqCst) {
                c.store(true, Ordering::SeqCst);
            } else {
                eprintln!();
                std::process::exit(130);
            }
        })
        .map_err(|e| format!("cannot install the Ctrl+C handler: {e}"))?;
    }
    let mut chat = Chat::new(args, conv.n_vocab());
    match prompt {
        Some(p) => chat.turn(conv, &p, &cancel, &generating).map(|stats| print_stats(&stats)),
        None => interactive(conv, &mut chat, &cancel, &generating),
    }
}

/// What a chat runs on: this process's engine ([`Local`]) or a distributed route (the coordinator's
/// [`CoordinatorSetup`]); both keep the conversation's tokens and continue from them.
trait Conversation {
    fn tokenizer(&self) -> Arc<Tokenizer>;
    fn ctx(&self) -> usize;
    fn n_vocab(&self) -> usize;
    fn tokens(&self) -> &[u32];
    fn prefill_chunk(&self) -> usize;
    fn reset(&mut self);
    /// `/ctx N`: a new context size (the conversation is cleared).
    fn set_ctx(&mut self, n: usize) -> Result<(), String>;
    /// Makes the conversation hold exactly `prompt` (prefix reuse); returns the tokens prefilled.
    fn sync(&mut self, prompt: &[u32], progress: &mut dyn FnMut(usize, usize), cancel: &AtomicBool) -> Result<usize, String>;
    /// `greedy`: the sampler is deterministic argmax (a route lets its last stage pick the token).
    #[allow(clippy::too_many_arguments)]
    fn generate(
        &mut self,
        max_tokens: usize,
        eos: u32,
        greedy: bool,
        sample: &mut dyn FnMut(&[f32]) -> u32,
        on_token: &mut dyn FnMut(u32) -> bool,
        cancel: &AtomicBool,
        stats: &mut GenStats,
    ) -> Result<StopReason, String>;
}

struct Local {
    eng: Engine,
    session: Session,
    tokenizer: Arc<Tokenizer>,
}

impl Conversation for Local {
    fn tokenizer(&self) -> Arc<Tokenizer> { self.tokenizer.clone() }
    fn ctx(&self) -> usize { self.eng.ctx }
    fn n_vocab(&self) -> usize { self.eng.cfg().n_vocab }
    fn tokens(&self) -> &[u32] { &self.session.tokens }
    fn prefill_chunk(&self) -> usize { self.session.prefill_chunk }
    fn reset(&mut self) { self.session.reset(&self.eng); }
    fn set_ctx(&mut self, n: usize) -> Result<(), String> {
        self.eng.ctx = n;
        let chunk = self.session.prefill_chunk;
        self.session = Session::new(&self.eng);
        self.session.prefill_chunk = chunk;
        Ok(())
    }
    fn sync(&mut self, prompt: &[u32], progress: &mut dyn FnMut(usize, usize), cancel: &AtomicBool) -> Result<usize, String> {
        self.session.sync(&mut self.eng, prompt, progress, cancel).map_err(|e| e.to_string())
    }
    fn generate(
        &mut self,
        max_tokens: usize,
        eos: u32,
        greedy: bool,
        sample: &mut dyn FnMut(&[f32]) -> u32,
        on_token: &mut dyn FnMut(u32) -> bool,
        cancel: &AtomicBool,
        stats: &mut GenStats,
    ) -> Result<StopReason, String> {
        self.session.generate(&mut self.eng, max_tokens, Some(eos), greedy, sample, on_token, cancel, stats).map_err(|e| e.to_string())
    }
}

/// The coordinator's route: local layers 0:K, then the workers.
struct Route {
    setup: CoordinatorSetup,
    tokenizer: Arc<Tokenizer>,
}

impl Conversation for Route {
    fn tokenizer(&self) -> Arc<Tokenizer> { self.tokenizer.clone() }
    fn ctx(&self) -> usize { self.setup.session.ctx() }
    fn n_vocab(&self) -> usize { self.setup.cfg.n_vocab }
    fn tokens(&self) -> &[u32] { &self.setup.session.tokens }
    fn prefill_chunk(&self) -> usize { self.setup.session.opts.prefill_chunk }
    fn reset(&mut self) { self.setup.session.reset(); }
    fn set_ctx(&mut self, _n: usize) -> Result<(), String> {
        Err("/ctx is not available on a distributed route (the workers registered with the coordinator's --ctx)".into())
    }
    fn sync(&mut self, prompt: &[u32], progress: &mut dyn FnMut(usize, usize), cancel: &AtomicBool) -> Result<usize, String> {
        let s = &mut self.setup.session;
        let reuse = !s.tokens.is_empty() && prompt.len() > s.tokens.len() && prompt.starts_with(&s.tokens);
        let todo = prompt.len() - if reuse { s.tokens.len() } else { 0 };
        s.sync_cancellable(prompt, cancel).map_err(|e| e.to_string())?;
        progress(todo, todo);
        Ok(todo)
    }
    fn generate(
        &mut self,
        max_tokens: usize,
        eos: u32,
        greedy: bool,
        sample: &mut dyn FnMut(&[f32]) -> u32,
        on_token: &mut dyn FnMut(u32) -> bool,
        cancel: &AtomicBool,
        stats: &mut GenStats,
    ) -> Result<StopReason, String> {
        self.setup.session.generate(max_tokens, Some(eos), greedy, sample, on_token, cancel, stats).map_err(|e| e.to_string())
    }
}

/// A multi-turn conversation kept as tokens, so each turn only prefills what is new.
struct Chat {
    mode: ThinkMode,
    system: Option<String>,
    sampler: Sampler,
    greedy: bool,
    max_tokens: usize,
    debug: bool,
}

impl Chat {
    fn new(a: &Args, n_vocab: usize) -> Self {
        let cfg = SamplerConfig { temperature: a.temp, top_k: a.top_k, top_p: a.top_p, min_p: a.min_p, seed: a.seed };
        let greedy = cfg.temperature.is_nan() || cfg.temperature <= 0.0 || cfg.top_k == 1;
        Self { mode: mode_of(a), system: a.system.clone(), sampler: Sampler::with_capacity(cfg, n_vocab), greedy, max_tokens: a.tokens, debug: a.debug }
    }

    /// Renders the next user turn as tokens appended to the conversation.
    fn prompt_tokens(&self, conv: &dyn Conversation, user: &str) -> Result<Vec<u32>, String> {
        let tok = conv.tokenizer();
        let ids = tok.chat_ids().map_err(|e| e.to_string())?;
        if conv.tokens().is_empty() {
            return Ok(tok.encode(&first_turn(self.system.as_deref(), user, self.mode, conv.ctx())));
        }
        // Later turns: the previous answer is closed with EOS, then a new user turn opens the reply.
        let mut t = conv.tokens().to_vec();
        if t.last() != Some(&ids.eos) {
            t.push(ids.eos);
        }
        let opener = if self.mode.effective(conv.ctx() as u64).thinking() { "<think>" } else { "</think>" };
        t.extend(tok.encode(&format!("<｜User｜>{user}<｜Assistant｜>{opener}")));
        Ok(t)
    }

    fn turn(&mut self, conv: &mut dyn Conversation, user: &str, cancel: &AtomicBool, generating: &AtomicBool) -> Result<GenStats, String> {
        let ctx = conv.ctx();
        if self.mode == ThinkMode::Max && self.mode.effective(ctx as u64) != ThinkMode::Max {
            eprintln!("ds4: --think-max needs --ctx >= 393216; using normal thinking");
        }
        let prompt = self.prompt_tokens(conv, user)?;
        if prompt.len() >= ctx {
            return Err(format!("prompt has {} tokens, which does not fit --ctx {ctx}", prompt.len()));
        }
        let mut stats = GenStats { prompt_tokens: prompt.len(), ..GenStats::default() };
        cancel.store(false, Ordering::SeqCst);
        generating.store(true, Ordering::SeqCst);
        let new = prompt.len() - common_prefix(conv.tokens(), &prompt);
        let bar = (new > conv.prefill_chunk()).then(|| {
            let b = ProgressBar::new(new as u64);
            b.set_style(ProgressStyle::with_template("prefill {bar:40} {pos}/{len} tokens ({per_sec})").unwrap());
            b
        });
        let t0 = Instant::now();
        let res = conv.sync(&prompt, &mut |d, _| {
            if let Some(b) = &bar {
                b.set_position(d as u64);
            }
        }, cancel);
        if let Some(b) = bar {
            b.finish_and_clear();
        }
        stats.prefill_time = t0.elapsed();
        match res {
            Ok(n) => stats.prefilled_tokens = n,
            Err(e) => {
                generating.store(false, Ordering::SeqCst);
                conv.reset();
                if cancel.load(Ordering::SeqCst) {
                    eprintln!("\n[prefill interrupted]");
                    return Ok(stats);
                }
                return Err(e);
            }
        }
        let tok = conv.tokenizer();
        let ids = tok.chat_ids().map_err(|e| e.to_string())?;
        let mut dec = StreamDecoder::new();
        let mut out = std::io::stdout().lock();
        let sampler = &mut self.sampler;
        let debug = self.debug;
        let reason = conv
            .generate(
                self.max_tokens,
                ids.eos,
                self.greedy,
                &mut |l| sampler.sample(l),
                &mut |t| {
                    let piece = if tok.is_added(t) { tok.token_text(t) } else { dec.push(&tok, t) };
                    let _ = out.write_all(piece.as_bytes());
                    let _ = out.flush();
                    if debug {
                        // Weight residency operations so far in this phase: stays 0 after load.
                        let c = ds4_model::residency::snapshot();
                        use ds4_model::residency::{Op, Phase};
                        eprintln!(
                            "[debug] token {t}: decode map={} bind={} upload={}",
                            c.get(Phase::Decode, Op::Map),
                            c.get(Phase::Decode, Op::Bind),
                            c.get(Phase::Decode, Op::Upload)
                        );
                    }
                    true
                },
                cancel,
                &mut stats,
            )
            .inspect_err(|_| {
                generating.store(false, Ordering::SeqCst);
                let _ = writeln!(std::io::stdout());
            })?;
        let rest = dec.finish();
        let _ = out.write_all(rest.as_bytes());
        let _ = writeln!(out);
        generating.store(false, Ordering::SeqCst);
        if reason == StopReason::Cancelled {
            eprintln!("[generation interrupted]");
        }
        if self.debug {
            eprintln!("ds4: stop reason {reason:?}, session {} tokens", conv.tokens().len());
        }
        Ok(stats)
    }
}

fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    if b.starts_with(a) { a.len() } else { 0 }
}

fn print_stats(s: &GenStats) {
    eprintln!(
        "prompt: {} tokens, prefill {:.2} t/s | generated: {} tokens, {:.2} t/s",
        s.prompt_tokens,
        s.prefill_tps(),
        s.gen_tokens,
        s.gen_tps()
    );
}

const HELP: &str = "commands: /help  /think  /think-max  /nothink  /ctx N  /read FILE  /quit";

fn interactive(conv: &mut dyn Conversation, chat: &mut Chat, cancel: &AtomicBool, generating: &AtomicBool) -> Result<(), String> {
    eprintln!("ds4 interactive chat ({HELP}); Ctrl+C stops a generation");
    let stdin = std::io::stdin();
    let mut line = String::new();
    loop {
        eprint!("> ");
        let _ = std::io::stderr().flush();
        line.clear();
        if stdin.lock().read_line(&mut line).map_err(|e| e.to_string())? == 0 {
            return Ok(());
        }
        let input = line.trim_end_matches(['\n', '\r']);
        let mut words = input.split_whitespace();
        let text = match words.next() {
            None => continue,
            Some("/quit") | Some("/exit") => return Ok(()),
            Some("/help") => {
                eprintln!("{HELP}");
                continue;
            }
            Some("/think") => {
                set_mode(chat, conv, ThinkMode::High);
                continue;
            }
            Some("/think-max") => {
                set_mode(chat, conv, ThinkMode::Max);
                continue;
            }
            Some("/nothink") => {
                set_mode(chat, conv, ThinkMode::None);
                continue;
            }
            Some("/ctx") => {
                match words.next().and_then(|w| w.parse::<usize>().ok()) {
                    Some(n) if n > 0 => match conv.set_ctx(n) {
                        Ok(()) => eprintln!("context set to {n} tokens; conversation cleared"),
                        Err(e) => eprintln!("{e}"),
                    },
                    _ => eprintln!("usage: /ctx N (a positive number of tokens)"),
                }
                continue;
            }
            Some("/read") => {
                let path = input["/read".len()..].trim();
                match std::fs::read_to_string(path) {
                    Ok(t) => t,
                    Err(e) => {
                        eprintln!("cannot read {path}: {e}");
                        continue;
                    }
                }
            }
            Some(w) if w.starts_with('/') => {
                eprintln!("unknown command {w}; {HELP}");
                continue;
            }
            Some(_) => input.to_string(),
        };
        match chat.turn(conv, &text, cancel, generating) {
            Ok(s) => print_stats(&s),
            Err(e) => eprintln!("ds4: {e}"),
        }
    }
}

fn set_mode(chat: &mut Chat, conv: &mut dyn Conversation, m: ThinkMode) {
    chat.mode = m;
    conv.reset();
    eprintln!("mode: {m:?} (conversation cleared)");
}
