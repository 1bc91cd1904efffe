//! A loaded model: the stage that runs it, its tokenizer, and the thread pool set-up.
use crate::backend::Backend;
use crate::device_stage::DeviceStage;
use crate::error::EngineError;
use ds4_gguf::GgufFile;
use crate::progress::Progress;
use ds4_model::hostload::{HostLoad, WeightMemory};
use ds4_model::mapplan::MapPlan;
use ds4_model::memplan::{admit, available_ram, ChunkFit, MemoryPlan, PlanInput, Placement};
use ds4_model::{residency, Config, KvState, LayerRange, Logits, Options, Stage, Weights};
use ds4_tokenizer::Tokenizer;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Where the CUDA backend keeps the weights (`--cuda-weights`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CudaWeights {
    /// In place on an integrated GPU (it shares the host's memory), copied to a discrete one.
    #[default]
    Auto,
    /// Copied into device memory.
    Device,
    /// Read in place from the registered host mapping (no device copy; over PCIe on a discrete GPU).
    Host,
}

impl CudaWeights {
    pub fn parse(s: &str) -> Result<Self, EngineError> {
        match s {
            "auto" => Ok(Self::Auto),
            "device" => Ok(Self::Device),
            "host" => Ok(Self::Host),
            o => Err(EngineError::Invalid(format!("unknown --cuda-weights `{o}` (expected device, host or auto)"))),
        }
    }
}

/// Largest context (`--ctx`) and prefill chunk (`--prefill-chunk`) accepted, in tokens: 2^30, a
/// thousand times DeepSeek V4's 1M context; beyond it the memory plan's byte counts could overflow.
pub const MAX_CTX: usize = 1 << 30;
/// Largest `--threads` accepted (more threads than this only oversubscribe the cores).
pub const MAX_THREADS: usize = 1024;
/// Largest number of KV states held at once (`--concurrency`, `--batched-session`, snapshots): beyond it
/// the memory plan's byte counts could overflow.
pub const MAX_SESSIONS: usize = 1 << 16;

#[derive(Debug, Clone)]
pub struct LoadOptions {
    pub ctx: usize,
    pub threads: Option<usize>,
    pub layers: Option<LayerRange>,
    pub options: Options,
    pub debug: bool,
    /// Prompt tokens per prefill batch (sizes the prefill working memory).
    pub prefill_chunk: usize,
    /// `--prefill-chunk` was not given: a GPU backend takes the largest chunk of 4096, 2048, 1024, ...
    /// (no more than `ctx` needs) whose work buffers fit beside the weights, and at least
    /// `prefill_chunk`; the CPU keeps `prefill_chunk`. `Engine::prefill_chunk()` tells the result.
    pub auto_chunk: bool,
    /// Memory budget in GiB; default: the RAM available before loading.
    pub mem_limit_gb: Option<f64>,
    pub backend: Backend,
    /// CUDA devices the layers are spread over in contiguous parts (the same device may repeat).
    pub cuda_devices: Vec<usize>,
    /// Where the CUDA backend keeps the weights.
    pub cuda_weights: CudaWeights,
    /// Host memory of the weights (`--weights copy|mmap`); None: the backend's default (a copy on the
    /// CPU, a mapping to upload from for a GPU).
    pub weights: Option<WeightMemory>,
    /// Pre-fault the weight mapping at load (`--warm-weights`); a copy reads every page anyway.
    pub warm_weights: bool,
    /// KV states held at once (a session plus the server's snapshots): the plan counts each.
    pub kv_states: usize,
    /// Sessions decoded together on a GPU backend (`--batched-session N`, `--concurrency N`): the
    /// device holds a KV slot for each (counted by its plan); `KvState::slot` picks one. 1: one.
    pub batch_slots: usize,
    /// Deterministic batched decode (`--deterministic`): on CUDA every row of a batch is computed as
    /// its session's one-token decode step computes it, so its tokens and logits are bit-identical to
    /// decoding it alone, at any batch size. Off, CUDA does so for batches of up to 8 sessions (faster
    /// there) and reads the weights once for larger batches with the multi-token kernels, which
    /// round differently. The CPU and wgpu batches are bit-identical either way.
    pub deterministic: bool,
    /// No progress bar or load timing lines on stderr (the memory plan line is still printed).
    pub quiet: bool,
    /// MTP speculative decoding (`--mtp FILE --mtp-draft N --mtp-margin F`).
    pub mtp: Option<crate::speculative::MtpOptions>,
    /// Directional steering (`--dir-steering-file/-ffn/-attn`): the CPU and wgpu backends edit the sub-layer
    /// outputs of every forward call while it is active (`Engine::set_steering_active`).
    pub steering: Vec<ds4_model::steering::SteerSpec>,
}

impl Default for LoadOptions {
    fn default() -> Self { Self {
            ctx: 32768,
            threads: None,
            layers: None,
            options: Options::default(),
            debug: false,
            prefill_chunk: 256,
            auto_chunk: false,
            mem_limit_gb: None,
            backend: Backend::Cpu,
            cuda_devices: vec![0],
            cuda_weights: CudaWeights::Auto,
            weights: None,
            warm_weights: false,
            kv_states: 1,
            batch_slots: 1,
            deterministic: false,
            quiet: false,
            mtp: None,
            steering: Vec::new(),
        } }
}

impl LoadOptions {
    /// Applies `--prefill-chunk`: the given chunk, or (None: not given) `auto_chunk` over the default.
    pub fn chunk_flag(self, flag: Option<usize>) -> Self { Self { prefill_chunk: flag.unwrap_or(Self::default().prefill_chunk), auto_chunk: flag.is_none(), ..self } }

    /// The weights' host memory: the flag, else copy on the CPU and a mapping for a GPU backend.
    pub fn weight_memory(&self) -> WeightMemory {
        self.weights.unwrap_or(if self.backend == Backend::Cpu { WeightMemory::Copy } else { WeightMemory::Mmap })
    }

    /// Checks the values that need no file; the messages name the flag.
    pub fn validate(&self) -> Result<(), EngineError> {
        let bad = |m: &str| Err(EngineError::Invalid(m.into()));
        if self.threads == Some(0) {
            return bad("--threads must be at least 1");
        }
        if let Some(t) = self.threads.filter(|&t| t > MAX_THREADS) {
            return Err(EngineError::Invalid(format!("--threads {t}: at most {MAX_THREADS}")));
        }
        if self.ctx == 0 {
            return bad("--ctx must be at least 1");
        }
        // Larger values would overflow the memory plan's byte counts (and no model attends that far).
        if self.ctx > MAX_CTX {
            return Err(EngineError::Invalid(format!("--ctx {}: at most {MAX_CTX} tokens", self.ctx)));
        }
        if self.prefill_chunk == 0 {
            return bad("--prefill-chunk must be at least 1");
        }
        if self.prefill_chunk > MAX_CTX {
            return Err(EngineError::Invalid(format!("--prefill-chunk {}: at most {MAX_CTX} tokens", self.prefill_chunk)));
        }
        if self.batch_slots == 0 {
            return bad("the batched session count must be at least 1");
        }
        if self.batch_slots > MAX_SESSIONS || self.kv_states > MAX_SESSIONS {
            return Err(EngineError::Invalid(format!("{} sessions held at once: at most {MAX_SESSIONS}", self.batch_slots.max(self.kv_states))));
        }
        if let Some(g) = self.mem_limit_gb {
            if !(g > 0.0 && g.is_finite()) {
                return Err(EngineError::Invalid(format!("--mem-limit-gb must be a positive number, got {g}")));
            }
        }
        self.backend.built()?;
        if self.backend == Backend::Cuda && self.cuda_devices.is_empty() {
            return bad("--cuda-devices must name at least one device");
        }
        if let Some(m) = &self.mtp {
            m.validate()?;
            self.backend.speculative(self.cuda_devices.len()).map_err(EngineError::Unsupported)?;
        }
        if !self.steering.is_empty() {
            if self.backend == Backend::Cuda {
                return Err(EngineError::Unsupported(
                    "--dir-steering-file: directional steering is not built for the CUDA backend yet: use --cpu, --vulkan or --metal (or run without it)".into(),
                ));
            }
            if self.layers.is_some() {
                return Err(EngineError::Unsupported("--dir-steering-file with --layers: steering is not carried to a distributed route's stages; run without it".into()));
            }
        }
        Ok(())
    }

    /// Host bytes the plan must fit: `--mem-limit-gb`, else the memory available now (before loading).
    fn budget(&self) -> u64 {
        match self.mem_limit_gb {
            Some(g) => (g * (1u64 << 30) as f64) as u64,
            None => available_ram().unwrap_or(u64::MAX),
        }
    }
}

pub struct Engine {
    /// The device copy of the stage when loaded with a GPU backend (then it runs every forward call).
    /// Declared first so it is dropped first: a device stage may read `stage`'s mapped weights in place.
    gpu: Option<Box<dyn DeviceStage>>,
    pub stage: Stage,
    pub tokenizer: Option<Arc<Tokenizer>>,
    pub ctx: usize,
    pub prefill_chunk: usize,
    pub plan: MemoryPlan,
    /// The MTP drafter when loaded with `--mtp` (speculative decoding, `Session::generate_speculative`).
    pub mtp: Option<crate::speculative::MtpEngine>,
    /// The host budget the plan was admitted by (`set_ctx` admits a new context by the same rule).
    budget: u64,
}

/// A model file planned for loading: its metadata, tokenizer and memory plan, admitted by the budget,
/// with no weight read yet. `load` reads them.
pub struct LoadPlan {
    path: PathBuf,
    opts: LoadOptions,
    pub file: Arc<GgufFile>,
    pub cfg: Config,
    pub range: LayerRange,
    pub tokenizer: Option<Arc<Tokenizer>>,
    pub memory: MemoryPlan,
    /// The host budget the plan was admitted by.
    pub budget: u64,
    spans: MapPlan,
    /// Where the CUDA backend keeps the weights (resolved from `--cuda-weights` and the device).
    place: CudaPlace,
    /// The steering files, read and checked at plan time.
    steering: Option<Arc<ds4_model::steering::Steering>>,
}

/// Where the CUDA backend keeps the weights, resolved at plan time (nothing without the `cuda` feature).
#[cfg(feature = "cuda")]
type CudaPlace = Option<ds4_cuda::WeightPlace>;
#[cfg(not(feature = "cuda"))]
type CudaPlace = ();

/// The plan of weights a GPU reads in place from the host mapping: counted once, as host memory that
/// stays resident (pinned), and not on the device.
fn host_weights_plan(mut p: MemoryPlan) -> MemoryPlan {
    p.memory = WeightMemory::Mmap;
    p.mapped = 0;
    p.device = p.device.saturating_sub(p.weights);
    p
}

/// The CPU stage's work buffers for prefill chunks of `prefill_chunk` tokens at context `ctx`; with MTP
/// drafting `draft` tokens, a verify step runs 1 + draft tokens with a logit row each.
fn reserve_cpu(stage: &mut Stage, prefill_chunk: usize, ctx: usize, draft: Option<usize>) {
    let draft_rows = draft.map_or(0, |d| d + 1);
    let head = stage.w.range.head as usize;
    stage.reserve(prefill_chunk.max(draft_rows), ctx, head.max(draft_rows));
}

impl Engine {
    /// Plans and loads (see [`Engine::plan`] and [`LoadPlan::load`]).
    pub fn load(path: &Path, opts: &LoadOptions) -> Result<Self, EngineError> {
        Self::plan(path, opts)?.load()
    }

    /// Reads the file's metadata and tensor directory, makes the memory plan for `opts` and checks it
    /// against the budget (and, for a GPU backend, its free memory): a refusal comes before any weight
    /// is read, with the flag values that would fit.
    pub fn plan(path: &Path, opts: &LoadOptions) -> Result<LoadPlan, EngineError> {
        opts.validate()?;
        if let Some(t) = opts.threads {
            // The global pool can be built once per process; later calls keep the first setting.
            let _ = rayon::ThreadPoolBuilder::new().num_threads(t).build_global();
        }
        let file = Arc::new(GgufFile::open(path)?);
        let cfg = Config::from_gguf(&file)?;
        let shard = ds4_model::weights::shard_range(&file)?;
        let range = opts.layers.or(shard).unwrap_or_else(|| LayerRange::full(&cfg));
        let spans = Weights::map_plan(&file, &cfg, range)?;
        // The MTP drafter's weights are planned with the model's (its cache and buffers are a few rows).
        let mut mtp_bytes = 0;
        if let Some(m) = &opts.mtp {
            if !(range.embed && range.head) {
                return Err(EngineError::Unsupported(format!(
                    "--mtp with --layers {}: MTP drafting needs the embedding and the output head on this process, so it is not available on a distributed route (drafts are not carried between stages); run the route without --mtp",
                    range.label()
                )));
            }
            // Checked against the model before any weight is read.
            let f = ds4_model::mtp::check_file(&m.path, &cfg)?;
            mtp_bytes = Weights::mtp_map_plan(&f, &ds4_model::mtp::block_config(&cfg))?.bytes();
        }
        // The steering files against the model (sizes, values), before any weight is read.
        let steering = match opts.steering.as_slice() {
            [] => None,
            specs => Some(Arc::new(ds4_model::steering::Steering::load(specs, cfg.n_layer, cfg.n_embd)?)),
        };
        if opts.layers.is_some() || shard.is_some() || opts.debug {
            eprintln!("{}", spans.describe(&range.label()));
        }
        let placement = if opts.backend.is_gpu() { Placement::Accelerator } else { Placement::Cpu };
        // `--cuda-weights host`: the GPU reads the mapping in place, so the plan counts the weights once,
        // on the host (planned as a copy, then mapped: `host_weights_plan`), and none on the device.
        #[cfg(feature = "cuda")]
        let place = match opts.backend {
            Backend::Cuda => Some(crate::cuda_pipeline::weight_place(opts.cuda_weights, &opts.cuda_devices)?),
            _ => None,
        };
        #[cfg(feature = "cuda")]
        let host_weights = place == Some(ds4_cuda::WeightPlace::Host);
        #[cfg(not(feature = "cuda"))]
        let (host_weights, place) = (false, ());
        let input = PlanInput {
            cfg: &cfg,
            range,
            weights: spans.bytes() + mtp_bytes,
            ctx: opts.ctx,
            prefill_chunk: opts.prefill_chunk,
            threads: rayon::current_num_threads(),
            kv_states: opts.kv_states,
            memory: if host_weights { WeightMemory::Copy } else { opts.weight_memory() },
            placement,
        };
        let budget = opts.budget();
        let shown = MemoryPlan::new(&input);
        eprintln!("{}", if host_weights { host_weights_plan(shown) } else { shown }.describe(budget));
        let mut memory = admit(&input, budget).map_err(EngineError::Budget)?;
        if host_weights {
            memory = host_weights_plan(memory);
        }
        // The vocabulary is metadata: building the tokenizer reads no tensor data.
        let tokenizer = if file.get("tokenizer.ggml.tokens").is_some() { Some(Arc::new(Tokenizer::from_gguf(&file)?)) } else { None };
        Ok(LoadPlan {
            path: path.to_path_buf(),
            opts: opts.clone(),
            file,
            cfg,
            range,
            tokenizer,
            memory,
            budget,
            spans,
            place,
            steering,
        })
    }

    /// A CPU engine around an already built stage (no tokenizer; the stage's buffers grow on demand).
    pub fn from_stage(stage: Stage, ctx: usize) -> Self {
        let range = stage.w.range;
        let input = PlanInput {
            cfg: &stage.cfg,
            range,
            weights: stage.w.resident_bytes(),
            ctx,
            prefill_chunk: 1,
            threads: rayon::current_num_threads(),
            kv_states: 1,
            memory: WeightMemory::Copy,
            placement: Placement::Cpu,
        };
        let plan = MemoryPlan::new(&input);
        Self { gpu: None, stage, tokenizer: None, ctx, prefill_chunk: usize::MAX, plan, mtp: None, budget: u64::MAX }
    }

    /// A new context size for sessions created afterwards (ds4's interactive `/ctx N`), admitted as
    /// `--ctx N` would be at startup: on the CPU the memory plan for `n` must fit the budget the engine
    /// was loaded with (the work buffers are then reserved for it); a GPU backend's KV buffers were
    /// sized at load, so there `n` may not exceed the loaded context. Existing sessions keep their own
    /// size: replace them (`Session::new`). Returns the plan in force.
    pub fn set_ctx(&mut self, n: usize) -> Result<&MemoryPlan, EngineError> {
        if n == 0 {
            return Err(EngineError::Invalid("the context must be at least 1 token".into()));
        }
        if n > MAX_CTX {
            return Err(EngineError::Invalid(format!("a context is at most {MAX_CTX} tokens")));
        }
        if let Some(g) = &self.gpu {
            if n > self.plan.ctx {
                return Err(EngineError::Unsupported(format!(
                    "the {} backend's buffers were sized for --ctx {} at load; restart with --ctx {n} for a larger context",
                    g.backend().name(),
                    self.plan.ctx
                )));
            }
            self.ctx = n;
            return Ok(&self.plan);
        }
        let input = PlanInput {
            cfg: &self.stage.cfg,
            range: self.stage.w.range,
            weights: self.plan.weights,
            ctx: n,
            prefill_chunk: self.plan.prefill_chunk,
            threads: rayon::current_num_threads(),
            kv_states: self.plan.kv_states,
            memory: self.plan.memory,
            placement: Placement::Cpu,
        };
        let plan = admit(&input, self.budget).map_err(EngineError::Budget)?;
        reserve_cpu(&mut self.stage, self.plan.prefill_chunk, n, self.mtp.as_ref().map(|m| m.opts.draft));
        self.plan = plan;
        self.ctx = n;
        Ok(&self.plan)
    }

    /// The host budget the engine was admitted by (bytes).
    pub fn budget(&self) -> u64 { self.budget }

    /// Attaches an MTP drafter (what `--mtp` loads): sessions created afterwards draft with it (on a GPU
    /// backend, on its device: built there from `model`'s weights).
    pub fn attach_mtp(&mut self, model: ds4_model::mtp::Mtp, opts: crate::speculative::MtpOptions) -> Result<(), EngineError> {
        opts.validate()?;
        self.backend().speculative(1).map_err(EngineError::Unsupported)?;
        if let Some(g) = self.gpu.as_ref().filter(|g| !g.can_journal()) {
            return Err(EngineError::Unsupported(format!("--mtp: the {} backend cannot verify drafts here (over several devices?); run without --mtp", g.backend().name())));
        }
        let r = self.range();
        if !(r.embed && r.head) {
            return Err(EngineError::Unsupported("MTP drafting needs the embedding and the output head on this stage".into()));
        }
        let device = match self.gpu.as_mut() {
            Some(g) => {
                let (dev, bytes) = g.mtp_drafter(&model.stage, self.ctx)?;
                self.plan.device += bytes;
                Some(crate::drafter::DeviceMtp::new(dev, bytes))
            }
            None => None,
        };
        self.mtp = Some(crate::speculative::MtpEngine::new(model, opts, device));
        Ok(())
    }

    /// A fresh KV state for this engine's layers (on a GPU backend it only tracks the position: the
    /// state itself lives on the device).
    pub fn new_kv(&self) -> KvState { self.stage.new_kv(self.ctx) }

    /// The steering loaded with `--dir-steering-file` (None: none).
    pub fn steering(&self) -> Option<&ds4_model::steering::Steering> { self.stage.steering.as_deref() }

    /// Turns the loaded steering on or off for later forward calls (the server's
    /// `--dir-steering-policy` steers only some phases of a request). No-op without steering.
    pub fn set_steering_active(&mut self, on: bool) { self.stage.steer_gate.store(on, std::sync::atomic::Ordering::Relaxed); }

    /// The switch `set_steering_active` sets, for a callback that runs between decode steps.
    pub fn steering_gate(&self) -> Arc<std::sync::atomic::AtomicBool> { self.stage.steer_gate.clone() }

    /// Which sessions of the next `decode_batch` are steered (in its order); empty: all.
    pub fn set_steering_rows(&mut self, rows: &[bool]) {
        self.stage.steer_rows.clear();
        self.stage.steer_rows.extend_from_slice(rows);
        if let Some(g) = self.gpu.as_mut() {
            g.steer_rows(rows);
        }
    }

    /// Sets slot `slot`'s FFN scale (ds4's `/steer F`); the KV state is kept.
    pub fn set_steering_ffn(&mut self, slot: usize, v: f32) -> Result<(), EngineError> {
        let st = self.stage.steering.as_mut().ok_or_else(|| EngineError::Invalid("no steering loaded: start with --dir-steering-file FILE".into()))?;
        Arc::make_mut(st).set_ffn(slot, v)?;
        if let Some(g) = self.gpu.as_mut() {
            g.set_steering(Some(st), self.stage.steer_gate.clone())?;
        }
        Ok(())
    }

    /// The layers this engine runs.
    pub fn range(&self) -> LayerRange { self.stage.w.range }

    /// True when the backend holds one KV state per slot (on the device): a second sequence in the
    /// same slot replaces the first.
    pub fn single_kv(&self) -> bool { self.backend().is_gpu() }

    /// Sessions the backend holds at once: on a GPU backend the device's KV slots (`KvState::slot`
    /// must be below it; each session in its own slot), unbounded on the CPU (a state is its own).
    pub fn kv_slots(&self) -> usize { self.gpu.as_ref().map_or(usize::MAX, |g| g.kv_slots()) }

    /// The HC streams after the last forward call (n × hc_dim): what a stage without the head hands on.
    pub fn hidden(&mut self, n: usize) -> Result<&[f32], EngineError> {
        if let Some(g) = self.gpu.as_mut() {
            return Ok(g.hidden(n)?);
        }
        Ok(self.stage.hidden(n))
    }

    /// Starts an undo journal on `kv` (speculative verification): later forward calls can be undone
    /// with `kv_rollback`. On a GPU backend the device checkpoints its state (where it can).
    pub fn kv_begin_journal(&mut self, kv: &mut KvState) -> Result<(), EngineError> {
        if let Some(g) = self.gpu.as_mut() {
            return Ok(g.begin_journal(kv)?);
        }
        kv.begin_journal();
        Ok(())
    }

    /// Returns `kv` to position `pos` of its journal (see `KvState::rollback`).
    pub fn kv_rollback(&mut self, kv: &mut KvState, pos: usize) -> Result<(), EngineError> {
        if let Some(g) = self.gpu.as_mut() {
            return Ok(g.rollback(kv, pos)?);
        }
        kv.rollback(pos).map_err(EngineError::Invalid)
    }

    /// Stops the journal on `kv`, keeping the state.
    pub fn kv_end_journal(&mut self, kv: &mut KvState) {
        if let Some(g) = self.gpu.as_mut() {
            g.end_journal();
        }
        kv.end_journal();
    }

    /// Runs the forward pass on the loaded backend (same contract as `Stage::forward`).
    pub fn forward(&mut self, kv: &mut KvState, tokens: &[u32], hidden_in: Option<&[f32]>, want: Logits) -> Result<&[f32], EngineError> {
        if let Some(g) = self.gpu.as_mut() {
            return Ok(g.forward(kv, tokens, hidden_in, want)?);
        }
        Ok(self.stage.forward(kv, tokens, hidden_in, want)?)
    }

    /// True when the backend can step several sequences in one pass (`decode_batch`): the CPU, and a
    /// GPU backend built with several KV slots (`LoadOptions::batch_slots`; wgpu, and CUDA on one GPU).
    pub fn batched_decode(&self) -> bool { self.backend() == Backend::Cpu || self.gpu.as_ref().is_some_and(|g| g.kv_slots() > 1) }

    /// One decode step for several sequences at once: `tokens[s]` is fed to `kvs[s]` at its own position,
    /// reading every weight once for the batch. Returns one logit row per sequence, each bit-identical
    /// to a `forward` of that token alone (on CUDA for batches of up to 8 sequences, and for any with
    /// `LoadOptions::deterministic`; a larger default batch rounds as its prefill does). On a GPU backend each sequence lives in its own KV slot
    /// (`kvs[s].slot`, all different, below `kv_slots()`), where its prefill ran.
    pub fn decode_batch(&mut self, kvs: &mut [&mut KvState], tokens: &[u32]) -> Result<&[f32], EngineError> {
        if !self.batched_decode() {
            if self.gpu.as_ref().is_some_and(|g| g.kv_slots() == 1) {
                return Err(EngineError::Unsupported(format!("batched decode on the {} backend needs a KV slot per session: this engine was loaded with one (LoadOptions::batch_slots)", self.backend().name())));
            }
            return Err(EngineError::Unsupported(format!("batched decode is not yet available on the {} backend: decode one sequence at a time", self.backend().name())));
        }
        if let Some(g) = self.gpu.as_mut() {
            return Ok(g.forward_batch(kvs, tokens)?);
        }
        Ok(self.stage.forward_batch(kvs, tokens, None)?)
    }

    /// Feeds `tokens` (with `hidden_in` as in `forward`) and returns the greedy next token and its
    /// log-probability, taken on the GPU (8 bytes come back instead of the logits row, and the host
    /// scans nothing). None on the CPU backend, without running anything: use `forward` there.
    pub fn forward_top1(&mut self, kv: &mut KvState, tokens: &[u32], hidden_in: Option<&[f32]>) -> Result<Option<(u32, f32)>, EngineError> {
        match self.gpu.as_mut() {
            Some(g) => Ok(Some(g.forward_argmax(kv, tokens, hidden_in)?)),
            None => Ok(None),
        }
    }

    /// Feeds `tokens` and returns every row's greedy pick (index, log-probability), taken on the GPU
    /// where the step can (a verify step: a few bytes come back instead of the logits rows). None on
    /// the CPU backend, without running anything: use `forward` there.
    pub fn forward_picks(&mut self, kv: &mut KvState, tokens: &[u32]) -> Result<Option<&[(u32, f32)]>, EngineError> {
        match self.gpu.as_mut() {
            Some(g) => Ok(Some(g.forward_picks(kv, tokens)?)),
            None => Ok(None),
        }
    }

    /// Copies logits row `row` of the last `forward_picks` call into `out` (the GPU keeps them).
    pub fn logits_row(&mut self, row: usize, out: &mut Vec<f32>) -> Result<(), EngineError> {
        if let Some(g) = self.gpu.as_mut() {
            out.clear();
            out.extend_from_slice(g.logits_row(row)?);
            return Ok(());
        }
        Err(EngineError::Invalid("no device logits to fetch on the CPU backend".into()))
    }

    /// Copies the logits of the last `forward_top1` call into `out` (the GPU keeps them).
    pub fn last_logits(&mut self, out: &mut Vec<f32>) -> Result<(), EngineError> {
        if let Some(g) = self.gpu.as_mut() {
            out.clear();
            out.extend_from_slice(g.last_logits()?);
            return Ok(());
        }
        Err(EngineError::Invalid("no device logits to fetch on the CPU backend".into()))
    }

    /// Brings `kv` up to date with the backend's state at `kv.pos` (on a GPU backend the state lives on
    /// the device: this downloads it, e.g. before saving it to a file). A no-op on the CPU.
    pub fn kv_to_host(&mut self, kv: &mut KvState) -> Result<(), EngineError> {
        match self.gpu.as_mut() {
            Some(g) => Ok(g.download_kv(kv)?),
            None => Ok(()),
        }
    }

    /// Makes `kv` (e.g. loaded from a file) the backend's state: the next forward call continues from
    /// `kv.pos`. Uploads it on a GPU backend; a no-op on the CPU, which reads `kv` itself.
    pub fn kv_to_device(&mut self, kv: &KvState) -> Result<(), EngineError> {
        match self.gpu.as_mut() {
            Some(g) => Ok(g.upload_kv(kv)?),
            None => Ok(()),
        }
    }

    /// Which backend runs the forward pass.
    pub fn backend(&self) -> Backend { self.gpu.as_ref().map_or(Backend::Cpu, |g| g.backend()) }

    /// Backend counters for benchmark output: for CUDA device allocations and weight uploads so far, and
    /// the per-kernel profile when enabled (DS4_CUDA_PROFILE=1); for wgpu the device. None on the CPU.
    pub fn backend_report(&mut self) -> Option<String> { self.gpu.as_mut().and_then(|g| g.report()) }

    pub fn cfg(&self) -> &Config { &self.stage.cfg }

    pub fn tokenizer(&self) -> Result<Arc<Tokenizer>, EngineError> {
        self.tokenizer.clone().ok_or_else(|| EngineError::Invalid("the model file carries no tokenizer".into()))
    }
}

impl LoadPlan {
    /// Brings the weights in (copied or mapped as planned, with a progress bar on a terminal) and
    /// builds the engine: its backend, and the CPU's work buffers sized by the plan.
    pub fn load(self) -> Result<Engine, EngineError> {
        let LoadPlan { path, opts, file, cfg, range, tokenizer, mut memory, spans, place, steering, budget, .. } = self;
        residency::set_phase(residency::Phase::Load);
        let mem = memory.memory;
        let reads = mem == WeightMemory::Copy || opts.warm_weights;
        let what = match (mem, opts.warm_weights) {
            (WeightMemory::Copy, _) => "loading weights (copy)",
            (WeightMemory::Mmap, true) => "warming weights (mmap)",
            (WeightMemory::Mmap, false) => "mapping weights (mmap, pages load on first use)",
        };
        let progress = Progress::start(what, spans.bytes(), reads, opts.quiet);
        let report = |done: u64| progress.set(done);
        let weights = Weights::bind_with(file, &path, &cfg, range, &HostLoad { memory: mem, warm: opts.warm_weights, progress: &report })?;
        progress.finish();
        let mut stage = Stage::new(cfg, weights, opts.options);
        stage.steering = steering;
        if !opts.quiet {
            for (i, s) in opts.steering.iter().enumerate() {
                eprintln!("steering {}: {} (ffn {}, attn {})", i + 1, s.file.display(), s.ffn, s.attn);
            }
        }
        // A GPU backend drafts on its device: the block's weights stay in the file's mapping until
        // the device takes them, and the device's fit check counts them with the model's.
        let mut gpu_mtp = match &opts.mtp {
            Some(m) if opts.backend.is_gpu() => Some(ds4_model::mtp::Mtp::load_mapped(&m.path, &stage.cfg, opts.options)?),
            _ => None,
        };
        let mut gpu = load_device(&stage, &opts, &mut memory, place, gpu_mtp.as_ref().map(|m| &m.stage))?;
        if let (Some(g), Some(st)) = (gpu.as_mut(), stage.steering.as_deref()) {
            g.set_steering(Some(st), stage.steer_gate.clone())?;
        }
        if opts.backend == Backend::Cpu {
            reserve_cpu(&mut stage, opts.prefill_chunk, opts.ctx, opts.mtp.as_ref().map(|m| m.draft));
        }
        let mtp = match &opts.mtp {
            Some(m) => {
                let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
                if let Some(g) = gpu.as_ref().filter(|g| !g.can_journal()) {
                    let why = if opts.cuda_devices.len() > 1 { " over several --cuda-devices parts (it verifies on one GPU)" } else { "" };
                    return Err(EngineError::Invalid(format!("--mtp: the {} backend cannot verify drafts{why}; run without --mtp", g.backend().name())));
                }
                let mtp = match (gpu.as_mut(), gpu_mtp.take()) {
                    (Some(g), Some(model)) => {
                        let (dev, bytes) = g.mtp_drafter(&model.stage, opts.ctx)?;
                        memory.device += bytes;
                        crate::speculative::MtpEngine::new(model, m.clone(), Some(crate::drafter::DeviceMtp::new(dev, bytes)))
                    }
                    _ => crate::speculative::MtpEngine::new(ds4_model::mtp::Mtp::load(&m.path, &stage.cfg, opts.options)?, m.clone(), None),
                };
                if !opts.quiet {
                    let place = if mtp.on_device() { format!(", drafting on {} (device {:.2} GiB, the output matrix shared with the model)", opts.backend.name(), gib(mtp.device_bytes())) } else { String::new() };
                    eprintln!("mtp: {} ({:.2} GiB), draft {}, margin {}{place}", m.path.display(), gib(mtp.model.resident_bytes()), m.draft, m.margin);
                }
                Some(mtp)
            }
            None => None,
        };
        // A GPU that chose its chunk prefills in chunks of what it holds.
        let prefill_chunk = match gpu.as_ref() {
            Some(g) if opts.auto_chunk => g.rows(),
            _ => opts.prefill_chunk,
        };
        Ok(Engine { gpu, stage, tokenizer, ctx: opts.ctx, prefill_chunk, plan: memory, mtp, budget })
    }
}

/// Builds the device stage of a GPU backend (None on the CPU). The wgpu stage's own device plan
/// (`ds4_wgpu::plan_bytes`, known once the stage's tensors are bound) replaces the plan's estimate of
/// the device bytes and is printed before anything is uploaded; the stage refuses itself when it does
/// not fit the device.
fn load_device(
    stage: &Stage,
    opts: &LoadOptions,
    memory: &mut MemoryPlan,
    place: CudaPlace,
    mtp: Option<&Stage>,
) -> Result<Option<Box<dyn DeviceStage>>, EngineError> {
    // Activation rows: a prefill chunk's, and at least a verify step's (the token and its drafts).
    let rows = opts.prefill_chunk.max(opts.mtp.as_ref().map_or(0, |m| m.draft + 1));
    let fit = if opts.auto_chunk { ChunkFit::gpu_auto(opts.ctx, rows) } else { ChunkFit::fixed(rows) };
    let _ = (stage, &memory, place, fit, mtp);
    match opts.backend {
        Backend::Cpu => Ok(None),
        #[cfg(feature = "cuda")]
        Backend::Cuda => {
            let place = place.unwrap_or(ds4_cuda::WeightPlace::Device);
            // Room for the MTP drafter (its weights but the shared head, and a few rows of buffers),
            // placed after the stage, when choosing the chunk.
            let reserve = mtp.map_or(0, |m| m.w.resident_bytes() + (256 << 20));
            let p = crate::cuda_pipeline::CudaPipeline::load(stage, opts.ctx, ChunkFit { reserve, ..fit }, &opts.cuda_devices, place, opts.batch_slots, opts.deterministic)?;
            if opts.auto_chunk && !opts.quiet {
                eprintln!("cuda: prefill chunk {} (the largest of {} that fits; --prefill-chunk sets it)", p.rows(), chunk_list(&fit));
            }
            Ok(Some(Box::new(p)))
        }
        #[cfg(feature = "wgpu")]
        b @ (Backend::Vulkan | Backend::Metal) => {
            let reserve = mtp.map_or(0, |m| crate::wgpu_stage::mtp_plan_bytes(m, opts.ctx));
            let dev = crate::wgpu_stage::load(stage, opts.ctx, fit, b, opts.batch_slots, reserve)?;
            memory.device = crate::wgpu_stage::plan_bytes(stage, opts.ctx, dev.rows(), opts.batch_slots);
            if !opts.quiet {
                let how = if opts.auto_chunk { format!(", the largest of {} that fits", chunk_list(&fit)) } else { String::new() };
                eprintln!(
                "{}: device plan {:.2} GiB (weights, KV of {} session(s) and work buffers of layers {}, --ctx {}, prefill chunk {}{how})",
                b.name(),
                memory.device as f64 / (1u64 << 30) as f64,
                opts.batch_slots,
                stage.w.range.label(),
                opts.ctx,
                dev.rows()
                );
            }
            Ok(Some(dev))
        }
        // `LoadOptions::validate` refused it before anything was read.
        #[allow(unreachable_patterns)]
        b => Err(b.built().err().unwrap_or_else(|| EngineError::Unsupported(format!("--backend {}: not available", b.name())))),
    }
}

/// The candidate chunks of `fit`, for the log line ("4096 / 2048 / ... / 256").
#[allow(dead_code)]
fn chunk_list(fit: &ChunkFit) -> String { fit.candidates().iter().map(|n| n.to_string()).collect::<Vec<_>>().join(" / ") }
