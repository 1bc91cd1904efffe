//! Command line of `ds4-server` (flags follow the C engine, spec §5.1, plus `--api-key`, `--max-queue`).
use clap::Parser;
use std::path::PathBuf;

#[derive(Parser, Debug, Clone)]
#[command(name = "ds4-server", about = "DwarfStar: OpenAI- and Anthropic-compatible HTTP server for DeepSeek V4", version)]
pub struct Args {
    /// Model file (default: ./ds4flash.gguf, else the embedded tiny default model).
    #[arg(short = 'm', long = "model")]
    pub model: Option<PathBuf>,
    /// Context size in tokens (all KV is allocated for it).
    #[arg(short = 'c', long = "ctx", default_value_t = 32768)]
    pub ctx: usize,
    /// Default maximum output tokens when a request sets no limit.
    #[arg(short = 'n', long = "tokens", default_value_t = 393216)]
    pub tokens: usize,
    /// Bind address (IPv4; `localhost` means 127.0.0.1).
    #[arg(long = "host", default_value = "127.0.0.1")]
    pub host: String,
    #[arg(long = "port", default_value_t = 8000)]
    pub port: u16,
    /// Allow cross-origin requests (Access-Control-Allow-Origin: *).
    #[arg(long = "cors")]
    pub cors: bool,
    /// CPU threads (default: all cores).
    #[arg(short = 't', long = "threads")]
    pub threads: Option<usize>,
    /// Append a human-readable per-request trace (rendered prompts, cache decisions, output) to FILE.
    #[arg(long = "trace")]
    pub trace: Option<PathBuf>,
    /// Default sampling temperature (requests may override; 0 = greedy).
    #[arg(long = "temp", default_value_t = 1.0)]
    pub temp: f32,
    #[arg(long = "top-k", default_value_t = 0)]
    pub top_k: usize,
    #[arg(long = "top-p", default_value_t = 1.0)]
    pub top_p: f32,
    #[arg(long = "min-p", default_value_t = 0.05)]
    pub min_p: f32,
    /// Sampling seed of requests that send none (each then samples the same way). Default: a fresh
    /// random seed per request, so repeated requests differ unless they send a `seed`.
    #[arg(long = "seed")]
    pub seed: Option<u64>,
    /// Thinking mode by default (the default).
    #[arg(long = "think", conflicts_with_all = ["nothink", "think_max"])]
    pub think: bool,
    /// Direct replies by default (requests can still ask for thinking).
    #[arg(long = "nothink", conflicts_with = "think_max")]
    pub nothink: bool,
    /// Think Max by default (needs --ctx >= 393216, else normal thinking).
    #[arg(long = "think-max")]
    pub think_max: bool,
    /// Require `Authorization: Bearer KEY` or `x-api-key: KEY` on every endpoint except /health.
    #[arg(long = "api-key", env = "DS4_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// Requests allowed to wait for the worker; more get 503. 0 = no limit.
    #[arg(long = "max-queue", default_value_t = 64)]
    pub max_queue: usize,
    /// Largest accepted request body in bytes.
    #[arg(long = "max-body-bytes", default_value_t = 64 << 20)]
    pub max_body_bytes: usize,
    /// Prompt tokens per prefill batch (with --batched-session, the slice a long prompt alternates with
    /// decode steps in). Default: on a GPU the largest of 4096, 2048, 1024, 512, 256 that fits beside
    /// the weights (ds4: 2048-4096); 256 on the CPU.
    #[arg(long = "prefill-chunk")]
    pub prefill_chunk: Option<usize>,
    /// Host memory of the weights: copy (huge-page memory, faster CPU decode; the CPU default) or mmap
    /// (map the file; a GPU backend's default).
    #[arg(long = "weights", env = "DS4_WEIGHTS", value_parser = ds4_engine::WeightMemory::parse)]
    pub weights: Option<ds4_engine::WeightMemory>,
    /// Read every weight page at startup (parallel pre-fault of the mapping, with progress), for no
    /// first-use stalls; --weights copy reads them all anyway.
    #[arg(long = "warm-weights")]
    pub warm_weights: bool,
    /// Compute backend: auto (CUDA, else a wgpu GPU, when built with them and present; else CPU), cpu,
    /// cuda (--features cuda), vulkan or metal (--features wgpu; wgpu = this platform's one).
    #[arg(long = "backend", default_value = "auto")]
    pub backend: String,
    /// With --backend cuda: GPUs the layers are spread over, in contiguous parts (e.g. 0,1,2,3).
    #[arg(long = "cuda-devices", visible_alias = "gpu-devices", value_delimiter = ',', default_value = "0")]
    pub cuda_devices: Vec<usize>,
    /// With --backend cuda: where the weights live: device (copied to GPU memory), host (read in place
    /// from the mapped file over the bus; no GPU copy), auto (host on an integrated GPU, else device).
    #[arg(long = "cuda-weights", default_value = "auto", value_parser = ["auto", "device", "host"])]
    pub cuda_weights: String,
    /// Memory budget in GiB: the server refuses to start when its memory plan exceeds it (default: the
    /// available RAM).
    #[arg(long = "mem-limit-gb")]
    pub mem_limit_gb: Option<f64>,
    /// KV sessions held at once and decoded together as one batch (1 = one request at a time). Each
    /// session has its own KV state and snapshots: the memory plan counts them all.
    #[arg(long = "batched-session", value_name = "N", default_value_t = 1)]
    pub batched_session: usize,
    /// With --batched-session N > 8 on CUDA: every row of every batch is computed as its session's own
    /// one-token step computes it (bit-identical to serving it alone). Batches of up to 8 sessions do
    /// so anyway (faster there); larger ones otherwise read each weight once with the multi-token
    /// kernels, which round differently. CPU and wgpu batches are bit-identical either way.
    #[arg(long = "deterministic")]
    pub deterministic: bool,
    /// KV snapshots kept for rewinding to a common prefix (0 disables rewinds).
    #[arg(long = "kv-snapshots", default_value_t = 8)]
    pub kv_snapshots: usize,
    /// Directory of the disk KV cache: sessions saved there survive restarts and conversation switches.
    #[arg(long = "kv-disk-dir")]
    pub kv_disk_dir: Option<PathBuf>,
    /// Space budget of the disk KV cache in MiB (fractions allowed); least useful files are evicted.
    #[arg(long = "kv-disk-space-mb", default_value_t = 8192.0)]
    pub kv_disk_space_mb: f64,
    /// Shortest session (in tokens) worth saving to (or loading from) the disk KV cache.
    #[arg(long = "kv-disk-min-tokens", visible_alias = "kv-cache-min-tokens", default_value_t = 512)]
    pub kv_disk_min_tokens: usize,
    /// Cold first prompts of [min, N] tokens are saved to the disk KV cache before generation (trimmed
    /// and aligned, below); 0 disables cold saves.
    #[arg(long = "kv-cache-cold-max-tokens", value_name = "N", default_value_t = 30000)]
    pub kv_cache_cold_max_tokens: usize,
    /// Save to the disk KV cache whenever a prefill crosses a multiple of N tokens; 0 disables.
    #[arg(long = "kv-cache-continued-interval-tokens", value_name = "N", default_value_t = 10000)]
    pub kv_cache_continued_interval_tokens: usize,
    /// Tokens dropped from the end of a cold prompt before it is saved (the tail is often edited).
    #[arg(long = "kv-cache-boundary-trim-tokens", value_name = "N", default_value_t = 32)]
    pub kv_cache_boundary_trim_tokens: usize,
    /// Cold saves are aligned down to a multiple of N tokens; 0 disables.
    #[arg(long = "kv-cache-boundary-align-tokens", value_name = "N", default_value_t = 2048)]
    pub kv_cache_boundary_align_tokens: usize,
    /// Refuse cache files written by a model with other weights (always the case here: a file is only
    /// loaded by the model identity that wrote it).
    #[arg(long = "kv-cache-reject-different-quant")]
    pub kv_cache_reject_different_quant: bool,
    /// Size of the tool-id → sampled DSML map.
    #[arg(long = "tool-memory-max-ids", default_value_t = 100000)]
    pub tool_memory_max_ids: usize,
    /// Render history tool calls canonically instead of replaying the sampled DSML.
    #[arg(long = "disable-exact-dsml-tool-replay")]
    pub disable_exact_dsml_tool_replay: bool,
    /// Open connections at most; past it a new connection replaces the longest-idle one, or gets 503
    /// when every connection has a request in flight.
    #[arg(long = "max-connections", default_value_t = 512)]
    pub max_connections: usize,
    /// Seconds a connection may stay without a request in flight (unfinished headers included).
    #[arg(long = "header-timeout-secs", default_value_t = 30)]
    pub header_timeout_secs: u64,
    /// Seconds allowed to receive a request body (408 after that).
    #[arg(long = "body-timeout-secs", default_value_t = 60)]
    pub body_timeout_secs: u64,
    /// Seconds a response write may wait for a client that does not read (its socket buffers full);
    /// the connection is then closed and its generation stopped (ds4: 10 s socket send timeout).
    #[arg(long = "send-timeout-secs", default_value_t = 10)]
    pub send_timeout_secs: u64,
    /// No per-request log lines or prefill progress on stderr.
    #[arg(long = "quiet", short = 'q')]
    pub quiet: bool,
    /// Seconds between `: prefill` SSE keep-alive comments.
    #[arg(long = "keepalive-secs", default_value_t = 5)]
    pub keepalive_secs: u64,
    /// TEST ONLY: JSON file of scripted replies `[{"when": "substring", "output": "text"}, ...]`. When
    /// the last message of a request contains `when`, the tokens of `output` are emitted instead of
    /// sampled ones (still run through the model, so KV state, streaming and tool-call parsing are real).
    /// Lets tests drive tool calls with a random-weights model. Never use in production.
    #[arg(long = "test-script")]
    pub test_script: Option<PathBuf>,
    /// Verbose diagnostics on stderr (distributed: one telemetry line per hop per request).
    #[arg(long = "debug")]
    pub debug: bool,
    /// Distributed inference as in `ds4`: `--role coordinator --layers 0:K --listen HOST PORT` serves
    /// requests through a route of this process's layers and the workers' (`ds4 --role worker`).
    #[command(flatten)]
    pub dist: ds4_dist::DistArgs,
    /// ds4 flags without a counterpart of another name.
    #[command(flatten)]
    pub ds4: crate::ds4_flags::Ds4Flags,
}

/// Largest value of a seconds flag (about 31 years).
pub const MAX_SECS: u64 = 1_000_000_000;

impl Args {
    /// Checks values clap cannot; the message names the flag.
    pub fn validate(&self) -> Result<(), String> {
        if self.ctx < 16 {
            return Err("--ctx must be at least 16".into());
        }
        if self.tokens == 0 {
            return Err("--tokens must be at least 1".into());
        }
        if self.prefill_chunk == Some(0) {
            return Err("--prefill-chunk must be at least 1".into());
        }
        if !(self.temp >= 0.0 && self.temp.is_finite()) {
            return Err("--temp must be a finite number >= 0".into());
        }
        if !(0.0..=1.0).contains(&self.top_p) {
            return Err("--top-p must be within [0, 1]".into());
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return Err("--min-p must be within [0, 1]".into());
        }
        if self.keepalive_secs == 0 {
            return Err("--keepalive-secs must be at least 1".into());
        }
        if self.max_body_bytes < 1024 {
            return Err("--max-body-bytes must be at least 1024".into());
        }
        if !(self.kv_disk_space_mb > 0.0 && self.kv_disk_space_mb.is_finite()) {
            return Err("--kv-disk-space-mb must be a positive number".into());
        }
        if self.kv_disk_min_tokens == 0 {
            return Err("--kv-disk-min-tokens must be at least 1".into());
        }
        if self.kv_cache_cold_max_tokens != 0 && self.kv_cache_cold_max_tokens < self.kv_disk_min_tokens {
            return Err("--kv-cache-cold-max-tokens must be 0 or at least --kv-cache-min-tokens".into());
        }
        if self.kv_snapshots >= ds4_engine::MAX_SESSIONS {
            return Err(format!("--kv-snapshots {}: at most {}", self.kv_snapshots, ds4_engine::MAX_SESSIONS - 1));
        }
        if self.batched_session == 0 {
            return Err("--batched-session must be at least 1".into());
        }
        if self.batched_session > 1 && self.dist.active() {
            return Err("--batched-session is not available with distributed inference (--role coordinator); use --batched-session 1".into());
        }
        if self.max_connections == 0 {
            return Err("--max-connections must be at least 1".into());
        }
        if self.header_timeout_secs == 0 || self.body_timeout_secs == 0 {
            return Err("--header-timeout-secs and --body-timeout-secs must be at least 1".into());
        }
        if self.send_timeout_secs == 0 {
            return Err("--send-timeout-secs must be at least 1".into());
        }
        // Larger values overflow the clock's deadlines (a panic in every connection, or every stream).
        for (flag, v) in [("--header-timeout-secs", self.header_timeout_secs), ("--body-timeout-secs", self.body_timeout_secs), ("--send-timeout-secs", self.send_timeout_secs), ("--keepalive-secs", self.keepalive_secs)] {
            if v > MAX_SECS {
                return Err(format!("{flag} {v}: at most {MAX_SECS} seconds"));
            }
        }
        ds4_engine::power::Power::new(self.ds4.power)?;
        if self.ds4.mixed_prefill_quantum == 0 {
            return Err("--mixed-prefill-quantum must be at least 1".into());
        }
        if let Some(line) = self.ds4.not_built() {
            return Err(line);
        }
        if matches!(&self.api_key, Some(k) if k.is_empty()) {
            return Err("--api-key must not be empty".into());
        }
        ds4_engine::Backend::parse(&self.backend).map_err(|e| format!("--backend: {e}"))?;
        if matches!(self.mem_limit_gb, Some(g) if !(g > 0.0 && g.is_finite())) {
            return Err("--mem-limit-gb must be a positive number".into());
        }
        self.dist.validate().map_err(|e| e.to_string())?;
        if self.dist.active() && self.backend != "cpu" {
            return Err(format!("--backend {} is not available on a coordinator: its own layers run on the CPU", self.backend));
        }
        if !self.ds4.steering.is_empty() {
            if self.dist.active() {
                return Err("--dir-steering-file is not available with --role coordinator: steering is not carried to a route's stages; run without it".into());
            }
            if self.backend == "cuda" {
                return Err("--dir-steering-file: directional steering is not built for the CUDA backend yet: use --cpu, --vulkan or --metal (or run without it)".into());
            }
            // Sizes are checked against the model when its metadata is read (before any weight).
            for s in &self.ds4.steering {
                std::fs::metadata(&s.file).map_err(|e| format!("--dir-steering-file {}: {e}", s.file.display()))?;
            }
        }
        if self.ds4.mtp_options()?.is_some() {
            if self.dist.active() {
                return Err("--mtp is not available with --role coordinator: the drafter needs the embedding and the output head beside it and drafts are not carried between stages; run the route without --mtp".into());
            }
            if self.batched_session > 1 {
                return Err("--mtp with --batched-session > 1: batched decode does not draft; use one or the other".into());
            }
            if let Ok(b) = ds4_engine::Backend::parse(&self.backend) {
                b.speculative(self.cuda_devices.len())?;
            }
        }
        if self.dist.is_worker() {
            return Err("ds4-server is a coordinator (--role coordinator); run workers with `ds4 --role worker`".into());
        }
        if self.dist.is_coordinator() && self.kv_disk_dir.is_some() {
            return Err("--kv-disk-dir is not available with --role coordinator (the workers' KV cannot be saved)".into());
        }
        Ok(())
    }

    pub fn bind_host(&self) -> String {
        if self.host == "localhost" {
            "127.0.0.1".into()
        } else {
            self.host.clone()
        }
    }
}
