//! A loaded model: the stage that runs it, its tokenizer, and the thread pool set-up.
use crate::error::EngineError;
use ds4_gguf::GgufFile;
use ds4_model::memplan::{available_ram, MemoryPlan};
use ds4_model::weights::WeightMemory;
use ds4_model::{residency, Config, KvState, LayerRange, Logits, Options, Stage, Weights};
use ds4_tokenizer::Tokenizer;
use std::path::Path;
use std::sync::Arc;

/// Which device runs the forward pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Backend {
    #[default]
    Cpu,
    /// NVIDIA GPU (needs the `cuda` cargo feature).
    Cuda,
}

impl Backend {
    pub fn parse(s: &str) -> Result<Self, EngineError> {
        match s {
            "cpu" => Ok(Self::Cpu),
            "cuda" => Ok(Self::Cuda),
            o => Err(EngineError::Invalid(format!("unknown backend `{o}` (expected cpu or cuda)"))),
        }
    }
}

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

#[derive(Debug, Clone)]
pub struct LoadOptions {
    pub ctx: usize,
    pub threads: Option<usize>,
    pub layers: Option<LayerRange>,
    pub options: Options,
    pub debug: bool,
    /// Prompt tokens per prefill batch (sizes the prefill working memory).
    pub prefill_chunk: usize,
    /// Memory budget in GiB; default: the RAM available now.
    pub mem_limit_gb: Option<f64>,
    pub backend: Backend,
    /// CUDA devices the layers are spread over in contiguous parts (the same device may repeat).
    pub cuda_devices: Vec<usize>,
    /// Where the CUDA backend keeps the weights.
    pub cuda_weights: CudaWeights,
}

impl Default for LoadOptions {
    fn default() -> Self { Self {
            ctx: 32768,
            threads: None,
            layers: None,
            options: Options::default(),
            debug: false,
            prefill_chunk: 256,
            mem_limit_gb: None,
            backend: Backend::Cpu,
            cuda_devices: vec![0],
            cuda_weights: CudaWeights::Auto,
        } }
}

pub struct Engine {
    pub stage: Stage,
    pub tokenizer: Option<Arc<Tokenizer>>,
    pub ctx: usize,
    pub prefill_chunk: usize,
    pub plan: MemoryPlan,
    /// The GPU copy of the stage when loaded with `Backend::Cuda` (then it runs every forward call).
    #[cfg(feature = "cuda")]
    cuda: Option<crate::cuda_pipeline::CudaPipeline>,
}

impl Engine {
    pub fn load(path: &Path, opts: &LoadOptions) -> Result<Self, EngineError> {
        if let Some(t) = opts.threads {
            if t == 0 {
                return Err(EngineError::Invalid("--threads must be at least 1".into()));
            }
            // The global pool can be built once per process; later calls keep the first setting.
            let _ = rayon::ThreadPoolBuilder::new().num_threads(t).build_global();
        }
        if opts.ctx == 0 {
            return Err(EngineError::Invalid("--ctx must be at least 1".into()));
        }
        let file = Arc::new(GgufFile::open(path)?);
        let cfg = Config::from_gguf(&file)?;
        let shard = ds4_model::weights::shard_range(&file)?;
        let range = opts.layers.or(shard).unwrap_or_else(|| LayerRange::full(&cfg));
        let tokenizer = if file.get("tokenizer.ggml.tokens").is_some() { Some(Arc::new(Tokenizer::from_gguf(&file)?)) } else { None };
        residency::set_phase(residency::Phase::Load);
        // The CPU reads weights from huge-page anonymous memory; a GPU backend uploads from the file mapping.
        let mem = if opts.backend == Backend::Cpu { WeightMemory::Anon } else { WeightMemory::Mmap };
        let weights = Weights::bind_with(file, path, &cfg, range, WeightMemory::from_env(mem))?;
        if opts.layers.is_some() || shard.is_some() || opts.debug {
            eprintln!("{}", weights.plan.describe(&range.label()));
        }
        if opts.prefill_chunk == 0 {
            return Err(EngineError::Invalid("--prefill-chunk must be at least 1".into()));
        }
        let threads = rayon::current_num_threads();
        // A GPU backend keeps the weights in device memory: the host only maps the file to upload it.
        #[cfg(feature = "cuda")]
        let place = match opts.backend {
            Backend::Cuda => Some(crate::cuda_pipeline::weight_place(opts.cuda_weights, &opts.cuda_devices)?),
            Backend::Cpu => None,
        };
        #[cfg(feature = "cuda")]
        let host_weights = place == Some(ds4_cuda::WeightPlace::Host);
        #[cfg(not(feature = "cuda"))]
        let host_weights = false;
        let plan = match opts.backend {
            Backend::Cpu => MemoryPlan::new(&cfg, range, weights.resident_bytes(), opts.ctx, opts.prefill_chunk, threads),
            // Weights the GPU reads in place stay pinned in host memory: the one copy is the host's.
            Backend::Cuda if host_weights => MemoryPlan { weights: weights.resident_bytes(), mapped: 0, ..MemoryPlan::for_accelerator(&cfg, range, 0, opts.ctx, opts.prefill_chunk) },
            Backend::Cuda => MemoryPlan::for_accelerator(&cfg, range, weights.resident_bytes(), opts.ctx, opts.prefill_chunk),
        };
        let budget = match opts.mem_limit_gb {
            Some(g) if g > 0.0 && g.is_finite() => (g * (1u64 << 30) as f64) as u64,
            Some(g) => return Err(EngineError::Invalid(format!("--mem-limit-gb must be a positive number, got {g}"))),
            None => available_ram().unwrap_or(u64::MAX),
        };
        eprintln!("{}", plan.describe(budget));
        plan.check(budget).map_err(EngineError::Budget)?;
        let mut stage = Stage::new(cfg, weights, opts.options);
        #[cfg(feature = "cuda")]
        let cuda = match opts.backend {
            Backend::Cuda => Some(crate::cuda_pipeline::CudaPipeline::load(&stage, opts.ctx, opts.prefill_chunk, &opts.cuda_devices, place.unwrap_or(ds4_cuda::WeightPlace::Device))?),
            Backend::Cpu => None,
        };
        #[cfg(not(feature = "cuda"))]
        if opts.backend == Backend::Cuda {
            return Err(EngineError::Invalid("--backend cuda: this binary was built without CUDA support (cargo build --features cuda)".into()));
        }
        if opts.backend == Backend::Cpu {
            stage.reserve(opts.prefill_chunk, opts.ctx, range.head as usize);
        }
        Ok(Self {
            stage,
            tokenizer,
            ctx: opts.ctx,
            prefill_chunk: opts.prefill_chunk,
            plan,
            #[cfg(feature = "cuda")]
            cuda,
        })
    }

    /// A CPU engine around an already built stage (no tokenizer; the stage's buffers grow on demand).
    pub fn from_stage(stage: Stage, ctx: usize) -> Self {
        let range = stage.w.range;
        let threads = rayon::current_num_threads();
        let plan = MemoryPlan::new(&stage.cfg, range, stage.w.resident_bytes(), ctx, 1, threads);
        Self {
            stage,
            tokenizer: None,
            ctx,
            prefill_chunk: usize::MAX,
            plan,
            #[cfg(feature = "cuda")]
            cuda: None,
        }
    }

    /// A fresh KV state for this engine's layers (on a GPU backend it only tracks the position: the
    /// state itself lives on the device).
    pub fn new_kv(&self) -> KvState { self.stage.new_kv(self.ctx) }

    /// The layers this engine runs.
    pub fn range(&self) -> LayerRange { self.stage.w.range }

    /// True when the backend holds one KV state (on the device): a second sequence replaces the first.
    pub fn single_kv(&self) -> bool { self.backend() == Backend::Cuda }

    /// The HC streams after the last forward call (n × hc_dim): what a stage without the head hands on.
    pub fn hidden(&mut self, n: usize) -> Result<&[f32], EngineError> {
        #[cfg(feature = "cuda")]
        if let Some(c) = self.cuda.as_mut() {
            return Ok(c.hidden(n)?);
        }
        Ok(self.stage.hidden(n))
    }

    /// Runs the forward pass on the loaded backend (same contract as `Stage::forward`).
    pub fn forward(&mut self, kv: &mut KvState, tokens: &[u32], hidden_in: Option<&[f32]>, want: Logits) -> Result<&[f32], EngineError> {
        #[cfg(feature = "cuda")]
        if let Some(c) = self.cuda.as_mut() {
            return Ok(c.forward(kv, tokens, hidden_in, want)?);
        }
        Ok(self.stage.forward(kv, tokens, hidden_in, want)?)
    }

    /// Feeds `tokens` (with `hidden_in` as in `forward`) and returns the greedy next token and its
    /// log-probability, taken on the GPU (8 bytes come back instead of the logits row, and the host
    /// scans nothing). None on the CPU backend, without running anything: use `forward` there.
    pub fn forward_top1(&mut self, kv: &mut KvState, tokens: &[u32], hidden_in: Option<&[f32]>) -> Result<Option<(u32, f32)>, EngineError> {
        #[cfg(feature = "cuda")]
        if let Some(c) = self.cuda.as_mut() {
            return Ok(Some(c.forward_argmax(kv, tokens, hidden_in)?));
        }
        let _ = (kv, tokens, hidden_in);
        Ok(None)
    }

    /// Copies the logits of the last `forward_top1` call into `out` (the GPU keeps them).
    pub fn last_logits(&mut self, out: &mut Vec<f32>) -> Result<(), EngineError> {
        #[cfg(feature = "cuda")]
        if let Some(c) = self.cuda.as_mut() {
            out.clear();
            out.extend_from_slice(c.last_logits()?);
            return Ok(());
        }
        let _ = out;
        Err(EngineError::Invalid("no device logits to fetch on the CPU backend".into()))
    }

    /// Brings `kv` up to date with the backend's state at `kv.pos` (on a GPU backend the state lives on
    /// the device: this downloads it, e.g. before saving it to a file). A no-op on the CPU.
    pub fn kv_to_host(&mut self, kv: &mut KvState) -> Result<(), EngineError> {
        #[cfg(feature = "cuda")]
        if let Some(c) = self.cuda.as_mut() {
            return Ok(c.download_kv(kv)?);
        }
        let _ = kv;
        Ok(())
    }

    /// Makes `kv` (e.g. loaded from a file) the backend's state: the next forward call continues from
    /// `kv.pos`. Uploads it on a GPU backend; a no-op on the CPU, which reads `kv` itself.
    pub fn kv_to_device(&mut self, kv: &KvState) -> Result<(), EngineError> {
        #[cfg(feature = "cuda")]
        if let Some(c) = self.cuda.as_mut() {
            return Ok(c.upload_kv(kv)?);
        }
        let _ = kv;
        Ok(())
    }

    /// Which backend runs the forward pass.
    pub fn backend(&self) -> Backend {
        #[cfg(feature = "cuda")]
        if self.cuda.is_some() {
            return Backend::Cuda;
        }
        Backend::Cpu
    }

    /// Backend counters for benchmark output: device allocations and weight uploads so far, and the
    /// per-kernel profile when enabled (DS4_CUDA_PROFILE=1). None on the CPU backend.
    pub fn backend_report(&mut self) -> Option<String> {
        #[cfg(feature = "cuda")]
        if let Some(c) = self.cuda.as_mut() {
            let s = ds4_cuda::CudaStage::stats();
            let mut r = format!("cuda: {} device allocations, {} weight uploads so far", s.device_allocs, s.weight_uploads);
            if let Some(p) = c.profile_report() {
                r.push('\n');
                r.push_str(&p);
            }
            return Some(r);
        }
        None
    }

    pub fn cfg(&self) -> &Config { &self.stage.cfg }

    pub fn tokenizer(&self) -> Result<Arc<Tokenizer>, EngineError> {
        self.tokenizer.clone().ok_or_else(|| EngineError::Invalid("the model file carries no tokenizer".into()))
    }
}
