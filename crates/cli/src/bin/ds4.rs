//! `ds4`: one-shot generation (`-p`, `--prompt-file`) and interactive multi-turn chat, on this
//! process's engine or, with `--role coordinator`, on a distributed route (`--role worker` serves a
//! layer slice instead).
use chat::{print_stats, Chat, ChatConfig, Display};
use clap::Parser;
use conversation::{Conversation, Local, Route};
use ds4_engine::{resolve_model, Engine, LoadOptions, ModelSource, Session};
use ds4_tokenizer::chat::ThinkMode;
use ds4_tokenizer::sampling::SamplerConfig;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

#[path = "../backend_flags.rs"]
mod backend_flags;
#[path = "../ds4/chat.rs"]
mod chat;
#[path = "../ds4/conversation.rs"]
mod conversation;
#[path = "../ds4/diagnostics.rs"]
mod diagnostics;
#[path = "../ds4_compat.rs"]
mod ds4_compat;
#[path = "../ds4/logprobs.rs"]
mod logprobs;
#[path = "../out_path.rs"]
mod out_path;
#[path = "../ds4/prefix_file.rs"]
mod prefix_file;
#[path = "../ds4/reasoning_view.rs"]
mod reasoning_view;
#[path = "../ds4/repl.rs"]
mod repl;

#[derive(Parser, Debug)]
#[command(name = "ds4", about = "DwarfStar: DeepSeek V4 inference (one-shot or interactive chat)", version, args_override_self = true,
    after_help = "The C engine's flags are accepted; those of features not built here (--dspark, --ssd-streaming, ...) exit 2 with a line saying so. Table: README.md, section 'Flags: from ds4 to DwarfStar'")]
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
    #[arg(short = 'c', long = "ctx", default_value_t = 32768, allow_negative_numbers = true)]
    ctx: usize,
    /// Maximum tokens to generate per answer (a line says when generation stopped there).
    #[arg(short = 'n', long = "tokens", default_value_t = 50000, allow_negative_numbers = true)]
    tokens: usize,
    /// Sampling temperature (0 = greedy).
    #[arg(long = "temp", default_value_t = 1.0, allow_negative_numbers = true)]
    temp: f32,
    #[arg(long = "top-k", default_value_t = 0, allow_negative_numbers = true)]
    top_k: usize,
    #[arg(long = "top-p", default_value_t = 1.0, allow_negative_numbers = true)]
    top_p: f32,
    #[arg(long = "min-p", default_value_t = 0.05, allow_negative_numbers = true)]
    min_p: f32,
    /// Sampling seed [default: a new random seed each run].
    #[arg(long = "seed", allow_negative_numbers = true)]
    seed: Option<u64>,
    /// Thinking mode (default).
    #[arg(long = "think", conflicts_with_all = ["nothink", "think_max"])]
    think: bool,
    /// Non-thinking mode.
    #[arg(long = "nothink", conflicts_with = "think_max")]
    nothink: bool,
    /// Think Max (needs --ctx >= 393216, else falls back to thinking).
    #[arg(long = "think-max")]
    think_max: bool,
    /// System prompt (-sys works too); "" for none.
    #[arg(long = "system", default_value = "You are a helpful assistant")]
    system: String,
    /// CPU threads (default: all cores).
    #[arg(short = 't', long = "threads", allow_negative_numbers = true)]
    threads: Option<usize>,
    /// Prompt tokens per prefill batch (sizes the prefill working memory). Default: on a GPU the largest
    /// of 4096, 2048, 1024, 512, 256 that fits beside the weights (ds4: 2048-4096); 256 on the CPU.
    #[arg(long = "prefill-chunk", allow_negative_numbers = true)]
    prefill_chunk: Option<usize>,
    /// Memory budget in GiB (default: the RAM available now); a plan over it refuses to start.
    #[arg(long = "mem-limit-gb", allow_negative_numbers = true)]
    mem_limit_gb: Option<f64>,
    /// Restore a session saved with --kv-save before the first prompt (it continues that conversation).
    #[arg(long = "kv-load")]
    kv_load: Option<std::path::PathBuf>,
    /// Save the session (KV state, tokens) to FILE on exit.
    #[arg(long = "kv-save")]
    kv_save: Option<std::path::PathBuf>,
    /// Verbose diagnostics on stderr.
    #[arg(long = "debug")]
    debug: bool,
    /// ds4's flags: backend switches, --quality, --power, diagnostics.
    #[command(flatten)]
    ds4: Ds4Flags,
    /// Distributed inference (--role, --layers, --listen, --coordinator, --dist-*).
    #[command(flatten)]
    dist: ds4_dist::DistArgs,
}

/// Flags with the C engine's spelling and meaning (ds4-features.md §3, §4.2).
#[derive(clap::Args, Debug)]
struct Ds4Flags {
    #[command(flatten)]
    sw: backend_flags::EngineSwitches,
    /// Start the conversation from earlier turns: `USER:` / `ASSISTANT:` blocks (complete pairs).
    #[arg(long = "prefix-file", conflicts_with = "raw_prompt")]
    prefix_file: Option<PathBuf>,
    /// Tokenize the prompt as written, without chat markers.
    #[arg(long = "raw-prompt")]
    raw_prompt: bool,
    /// Load the model, print a summary and exit.
    #[arg(long = "inspect")]
    inspect: bool,
    /// Print the prompt's token ids (tokenized as written, special tokens recognised) and exit.
    #[arg(long = "dump-tokens")]
    dump_tokens: bool,
    /// Greedy continuation (ignores --temp) writing each step's top alternatives as JSON to FILE.
    #[arg(long = "dump-logprobs")]
    dump_logprobs: Option<PathBuf>,
    /// Alternatives per token: with --dump-logprobs [default: 20]; alone, one JSON line per generated
    /// token on stdout (logprobs of the model's distribution, before temperature/top-p). At most 128.
    #[arg(long = "logprobs-top-k")]
    logprobs_top_k: Option<usize>,
    /// Print the perplexity of the text in FILE (teacher-forced) and exit.
    #[arg(long = "perplexity-file")]
    perplexity_file: Option<PathBuf>,
    /// Write the next-token logits after the prompt to FILE (JSON) and exit.
    #[arg(long = "dump-logits")]
    dump_logits: Option<PathBuf>,
    /// Decode N greedy tokens one step at a time, then prefill the same tokens afresh, and compare each
    /// position's logits (the decode path against the batched one); print the result and exit.
    #[arg(long = "decode-consistency", value_name = "N")]
    decode_consistency: Option<usize>,
    /// Rendered chat prompts (blocks after `===== DS4_IMATRIX_PROMPT` lines) to collect the routed
    /// experts' importance matrix over (CPU backend); with --imatrix-out.
    #[arg(long = "imatrix-dataset", value_name = "FILE", requires = "imatrix_out")]
    imatrix_dataset: Option<PathBuf>,
    /// Where to write the imatrix (legacy llama.cpp .dat, as ds4); with --imatrix-dataset.
    #[arg(long = "imatrix-out", value_name = "FILE", requires = "imatrix_dataset")]
    imatrix_out: Option<PathBuf>,
    /// Stop the imatrix collection after N prompts (0: no limit).
    #[arg(long = "imatrix-max-prompts", value_name = "N", default_value_t = 0)]
    imatrix_max_prompts: usize,
    /// Stop the imatrix collection after N prompt tokens (0: no limit).
    #[arg(long = "imatrix-max-tokens", value_name = "N", default_value_t = 0)]
    imatrix_max_tokens: usize,
}

fn main() -> ExitCode {
    let args: Args = backend_flags::parse_steered("ds4", ds4_compat::preprocess("ds4", std::env::args_os()), |a: &mut Args| &mut a.ds4.sw.steering);
    match run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ds4: {e}");
            ExitCode::from(1)
        }
    }
}

/// A usage error: printed and exit 2 (as clap's), before anything is loaded.
fn usage(msg: &str) -> ! {
    eprintln!("ds4: {msg}");
    std::process::exit(2)
}

/// Flag values and combinations that can be checked before loading anything (exit 2 when wrong).
fn check_usage(args: &Args) -> ds4_engine::Backend {
    let backend = args.ds4.sw.resolve_backend().unwrap_or_else(|e| usage(&e.0));
    if let Some(k) = args.ds4.logprobs_top_k {
        if k == 0 || k > logprobs::MAX_TOP_K {
            usage(&format!("--logprobs-top-k {k}: expected 1 to {}", logprobs::MAX_TOP_K));
        }
    }
    if let Err(e) = ds4_engine::power::Power::new(args.ds4.sw.power) {
        usage(&e);
    }
    let d = &args.ds4;
    let has_prompt = args.prompt.is_some() || args.prompt_file.is_some();
    if (d.dump_tokens || d.dump_logprobs.is_some() || d.dump_logits.is_some() || d.decode_consistency.is_some()) && !has_prompt {
        usage("--dump-tokens, --dump-logprobs, --dump-logits and --decode-consistency need a prompt (-p or --prompt-file)");
    }
    if d.imatrix_out.is_some() {
        if has_prompt || d.perplexity_file.is_some() || d.dump_tokens || d.decode_consistency.is_some() {
            usage("--imatrix-out collects over its dataset and exits: give it without a prompt or another diagnostic");
        }
        if args.dist.active() {
            usage("--imatrix-out runs on one process, not with --role");
        }
        if backend != ds4_engine::Backend::Cpu {
            usage(&format!("--imatrix-out: the imatrix is collected on the CPU backend in this build, not on {}: add --cpu", backend.name()));
        }
    }
    if d.decode_consistency == Some(0) {
        usage("--decode-consistency N: N must be at least 1");
    }
    if d.perplexity_file.is_some() && has_prompt {
        usage("--perplexity-file scores a file: give it without -p/--prompt-file");
    }
    if args.dist.active() && (d.inspect || d.dump_tokens || d.dump_logits.is_some() || d.perplexity_file.is_some() || d.decode_consistency.is_some()) {
        usage("--inspect, --dump-tokens, --dump-logits, --perplexity-file and --decode-consistency run on one process, not with --role");
    }
    if args.prefill_chunk == Some(0) {
        usage("--prefill-chunk must be at least 1");
    }
    if !(args.temp >= 0.0 && args.temp.is_finite()) || !(0.0..=1.0).contains(&args.top_p) || !(0.0..=1.0).contains(&args.min_p) {
        usage("--temp must be a number >= 0, --top-p and --min-p within [0, 1]");
    }
    // Output files: checked now, not after the generation that fills them.
    for (flag, path) in [("--dump-logprobs", &d.dump_logprobs), ("--dump-logits", &d.dump_logits), ("--imatrix-out", &d.imatrix_out)] {
        if let Some(p) = path {
            out_path::check_output(p).unwrap_or_else(|e| usage(&format!("{flag} {e}")));
        }
    }
    if let Some(p) = &args.kv_save {
        out_path::check_replaced(p).unwrap_or_else(|e| usage(&format!("--kv-save {e}")));
    }
    let mtp = d.sw.mtp.options().unwrap_or_else(|e| usage(&e));
    if mtp.is_some() {
        if args.dist.active() {
            usage("--mtp is not available with --role: the drafter needs the embedding and the output head beside it and drafts are not carried between stages; run the route without --mtp");
        }
        if d.dump_logprobs.is_some() || d.logprobs_top_k.is_some() {
            usage("--mtp with --dump-logprobs/--logprobs-top-k: accepted drafts skip the per-token logprob output; run without --mtp");
        }
        if let Err(e) = backend.speculative(args.ds4.sw.cuda_devices.len()) {
            usage(&e);
        }
    }
    backend
}

fn run(args: Args) -> Result<(), String> {
    let backend = check_usage(&args);
    let prefix = match &args.ds4.prefix_file {
        Some(f) => {
            let text = std::fs::read_to_string(f).map_err(|e| format!("cannot read {}: {e}", f.display()))?;
            prefix_file::parse(&text).map_err(|e| format!("{}: {e}", f.display()))?
        }
        None => Vec::new(),
    };
    let prompt = match (&args.prompt, &args.prompt_file) {
        (Some(p), _) => Some(p.clone()),
        (None, Some(f)) => Some(std::fs::read_to_string(f).map_err(|e| format!("cannot read prompt file {}: {e}", f.display()))?),
        _ => None,
    };
    if args.dist.active() || args.dist.validate().is_err() {
        return distributed(&args, backend, prefix, prompt);
    }
    let src = resolve_model(args.model.as_deref()).map_err(|e| e.to_string())?;
    if let ModelSource::EmbeddedDefault(p) = &src {
        eprintln!("ds4: no -m given and ./ds4flash.gguf not found: using the embedded tiny default model (random weights) {}", p.display());
    }
    if args.ds4.dump_tokens {
        let tok = diagnostics::file_tokenizer(src.path())?;
        return print_out(&diagnostics::dump_tokens(&tok, prompt.as_deref().unwrap_or_default()));
    }
    let t0 = Instant::now();
    let opts = load_options(&args, backend);
    if let Err(e) = opts.validate() {
        eprintln!("ds4: {e}");
        std::process::exit(2);
    }
    // Plan first: a refusal (memory, a prompt over --ctx) comes before any weight is read.
    let planned = Engine::plan(src.path(), &opts).map_err(|e| format!("{}: {e}", src.path().display()))?;
    if let (Some(p), None) = (&prompt, &args.kv_load) {
        prompt_fits(&args, &planned, &prefix, p)?;
    }
    let mut eng = planned.load().map_err(|e| format!("{}: {e}", src.path().display()))?;
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
    if args.ds4.inspect {
        return print_out(&diagnostics::inspect(src.path(), &eng));
    }
    let tokenizer = eng.tokenizer().map_err(|e| e.to_string())?;
    if let (Some(ds), Some(out)) = (&args.ds4.imatrix_dataset, &args.ds4.imatrix_out) {
        let d = &args.ds4;
        let r = diagnostics::collect_imatrix(&mut eng, &tokenizer, ds, out, d.imatrix_max_prompts, d.imatrix_max_tokens, &AtomicBool::new(false))?;
        eprintln!("ds4: wrote imatrix {} from {} prompts, {} tokens, {} routed expert observations", out.display(), r.prompts, r.tokens, r.routes);
        return Ok(());
    }
    if let Some(f) = &args.ds4.perplexity_file {
        let text = std::fs::read_to_string(f).map_err(|e| format!("cannot read {}: {e}", f.display()))?;
        let p = diagnostics::perplexity(&mut eng, &tokenizer, &text, &AtomicBool::new(false))?;
        return print_out(&format!("perplexity: {:.4} over {} tokens (mean NLL {:.4} nats)\n", p.mean_nll.exp(), p.tokens, p.mean_nll));
    }
    let mut session = Session::new(&eng);
    let kv_id = ds4_kvstore::stage_identity(&eng.stage);
    if let Some(p) = &args.kv_load {
        let s = &mut session;
        match ds4_kvstore::load_file(p, &kv_id, &mut s.kv, &mut s.logits, Some(eng.cfg().n_vocab)) {
            // On a GPU backend the restored state is uploaded (the file's format is the backend's own).
            Ok(r) => match eng.kv_to_device(&s.kv) {
                Ok(()) => s.tokens = r.tokens,
                Err(e) => {
                    eprintln!("ds4: WARNING --kv-load {}: {e}; starting a new session", p.display());
                    s.reset(&eng);
                }
            },
            Err(e) => {
                eprintln!("ds4: WARNING --kv-load {}: {e}; starting a new session", p.display());
                s.reset(&eng);
            }
        }
    }
    let mut conv = Local { eng, session, tokenizer };
    if let (Some(f), Some(p)) = (&args.ds4.dump_logits, &prompt) {
        return dump_logits(&args, &mut conv, prefix, p, f);
    }
    if let (Some(n), Some(p)) = (args.ds4.decode_consistency, &prompt) {
        return decode_consistency(&args, &mut conv, prefix, p, n);
    }
    let r = converse(&args, &mut conv, prefix, prompt);
    if let (Some(p), Ok(())) = (&args.kv_save, &r) {
        conv.eng.kv_to_host(&mut conv.session.kv).map_err(|e| format!("--kv-save {}: {e}", p.display()))?;
        let s = &conv.session;
        let st = ds4_kvstore::StateRef { tokens: &s.tokens, kv: &s.kv, logits: &s.logits, tool_map: &[] };
        ds4_kvstore::save_file(p, &kv_id, ds4_kvstore::Reason::Manual, &st).map_err(|e| format!("--kv-save {}: {e}", p.display()))?;
    }
    r
}

/// `--dump-logits`: prefill the prompt (rendered as the chat would) and write the next-token logits.
fn dump_logits(args: &Args, conv: &mut Local, prefix: Vec<ds4_tokenizer::chat::Message>, prompt: &str, file: &std::path::Path) -> Result<(), String> {
    let chat = Chat::new(chat_config(args, prefix), conv.n_vocab())?;
    let toks = chat.prompt_tokens(conv, prompt)?;
    conv.sync(&toks, &mut |_, _| {}, &AtomicBool::new(false))?;
    diagnostics::write_logits(file, toks.len(), &conv.session.logits)
}

/// `--decode-consistency N`: the prompt (rendered as the chat would), N greedy tokens decoded one step
/// at a time, and the same tokens prefilled afresh; one line per step with `--debug`.
fn decode_consistency(args: &Args, conv: &mut Local, prefix: Vec<ds4_tokenizer::chat::Message>, prompt: &str, n: usize) -> Result<(), String> {
    let chat = Chat::new(chat_config(args, prefix), conv.n_vocab())?;
    let toks = chat.prompt_tokens(conv, prompt)?;
    let c = diagnostics::decode_consistency(&mut conv.eng, &toks, n, &AtomicBool::new(false))?;
    if args.debug {
        for (i, (d, same)) in c.per_step.iter().enumerate() {
            eprintln!("ds4: decode step {i}: max |Δlogit| {d:.3e}{}", if *same { "" } else { ", argmax differs" });
        }
    }
    let worst = c.worst();
    print_out(&format!(
        "decode consistency: {} steps after {} prompt tokens ({}): max |Δlogit| {worst:.3e} ({:.3e} of max |logit| {:.3}), argmax agrees {}/{}\n",
        c.steps,
        toks.len(),
        conv.eng.backend().name(),
        worst / c.max_logit.max(f32::MIN_POSITIVE),
        c.max_logit,
        c.argmax_agree(),
        c.steps
    ))
}

/// A diagnostic's result on stdout: a failed write (a full disk) is an error (exit 1), not a panic.
fn print_out(text: &str) -> Result<(), String> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    chat::write_outcome(out.write_all(text.as_bytes()).and_then(|()| out.flush()), "to stdout")
}

/// How the model (or this process's layers of it) is loaded.
fn load_options(args: &Args, backend: ds4_engine::Backend) -> LoadOptions {
    LoadOptions {
        ctx: args.ctx,
        threads: args.threads,
        mem_limit_gb: args.mem_limit_gb,
        debug: args.debug,
        ..args.ds4.sw.load_options(backend)
    }
    .chunk_flag(args.prefill_chunk)
}

/// Refuses a one-shot prompt that cannot fit `--ctx`, from the planned model's tokenizer (metadata only,
/// before any weight is read): from its byte length alone when even the longest token could not make it
/// fit, else by rendering and tokenizing the first turn as the chat will.
fn prompt_fits(args: &Args, planned: &ds4_engine::LoadPlan, prefix: &[ds4_tokenizer::chat::Message], prompt: &str) -> Result<(), String> {
    let ctx = planned.memory.ctx;
    let tok = planned.tokenizer.clone().ok_or("the model file carries no tokenizer")?;
    let longest = tok.max_token_bytes();
    if prompt.len() / longest >= ctx {
        return Err(format!("the prompt has {} bytes, at least {} tokens, which does not fit --ctx {ctx}", prompt.len(), prompt.len() / longest));
    }
    let chat = Chat::new(chat_config(args, prefix.to_vec()), tok.n_vocab())?;
    let n = chat.first_turn_tokens(&tok, ctx, prompt).len();
    if n >= ctx {
        return Err(format!("prompt has {n} tokens, which does not fit --ctx {ctx}"));
    }
    Ok(())
}

/// `--role worker`: serve a layer slice; `--role coordinator`: the chat (one-shot or interactive) on
/// the route. Usage errors exit 2.
fn distributed(args: &Args, backend: ds4_engine::Backend, prefix: Vec<ds4_tokenizer::chat::Message>, prompt: Option<String>) -> Result<(), String> {
    let usage = |e: ds4_dist::DistError| -> String { std::process::exit({ eprintln!("ds4: {e}"); ds4_dist::cli::exit_code(&e) as i32 }) };
    args.dist.validate().map_err(usage)?;
    if args.dist.is_worker() {
        return ds4_dist::cli::worker_main(&args.dist, args.model.as_deref(), &load_options(args, backend)).map_err(usage);
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
    let setup = ds4_dist::cli::start_coordinator(&args.dist, src.path(), &load_options(args, backend), wait).map_err(usage)?;
    let tokenizer = setup.tokenizer.clone().ok_or_else(|| format!("{}: the model file carries no tokenizer", src.path().display()))?;
    converse(args, &mut Route { setup, tokenizer }, prefix, prompt)
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

/// The chat's settings from the flags: `--dump-logprobs` is greedy; without --seed the seed is random.
fn chat_config(a: &Args, prefix: Vec<ds4_tokenizer::chat::Message>) -> ChatConfig {
    let seed = a.seed.unwrap_or_else(random_seed);
    if a.debug {
        eprintln!("ds4: sampling seed {seed}");
    }
    let dump = a.ds4.dump_logprobs.is_some();
    let temperature = if dump { 0.0 } else { a.temp };
    ChatConfig {
        mode: mode_of(a),
        system: Some(a.system.clone()),
        prefix,
        sampler: SamplerConfig { temperature, top_k: a.top_k, top_p: a.top_p, min_p: a.min_p, seed },
        max_tokens: a.tokens,
        raw: a.ds4.raw_prompt,
        display: match a.ds4.logprobs_top_k {
            Some(k) if !dump => Display::Logprobs(k),
            _ => Display::Text,
        },
        record_top_k: dump.then(|| a.ds4.logprobs_top_k.unwrap_or(logprobs::DEFAULT_TOP_K)),
        power: a.ds4.sw.power,
        debug: a.debug,
    }
}

/// A seed that differs between runs (ds4 seeds from the time).
fn random_seed() -> u64 {
    let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0);
    t ^ (std::process::id() as u64).rotate_left(32)
}

/// One-shot (`prompt`) or interactive chat on `conv`, with Ctrl+C stopping a generation.
fn converse(args: &Args, conv: &mut dyn Conversation, prefix: Vec<ds4_tokenizer::chat::Message>, prompt: Option<String>) -> Result<(), String> {
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
    let mut chat = Chat::new(chat_config(args, prefix), conv.n_vocab())?;
    let Some(p) = prompt else {
        return repl::interactive(conv, &mut chat, &cancel, &generating);
    };
    let stats = chat.turn(conv, &p, &cancel, &generating)?;
    print_stats(&stats);
    if let Some(f) = &args.ds4.dump_logprobs {
        let k = args.ds4.logprobs_top_k.unwrap_or(logprobs::DEFAULT_TOP_K);
        let tok = conv.tokenizer();
        let v = logprobs::dump(&tok, stats.gen.prompt_tokens, conv.ctx(), k, &chat.recorded);
        std::fs::write(f, format!("{v}\n")).map_err(|e| format!("cannot write {}: {e}", f.display()))?;
        eprintln!("ds4: wrote {} steps to {}", chat.recorded.len(), f.display());
    }
    Ok(())
}
