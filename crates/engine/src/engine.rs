//! A loaded model: the stage that runs it, its tokenizer, and the thread pool set-up.
use crate::error::EngineError;
use ds4_gguf::GgufFile;
use ds4_model::{residency, Config, LayerRange, Options, Stage, Weights};
use ds4_tokenizer::Tokenizer;
use std::path::Path;
use std::sync::Arc;

#[derive(Debug, Clone)]
pub struct LoadOptions {
    pub ctx: usize,
    pub threads: Option<usize>,
    pub layers: Option<LayerRange>,
    pub options: Options,
    pub debug: bool,
}

impl Default for LoadOptions {
    fn default() -> Self { Self { ctx: 32768, threads: None, layers: None, options: Options::default(), debug: false } }
}

pub struct Engine {
    pub stage: Stage,
    pub tokenizer: Option<Arc<Tokenizer>>,
    pub ctx: usize,
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
        let weights = Weights::bind_mapped(file, path, &cfg, range)?;
        if opts.layers.is_some() || shard.is_some() || opts.debug {
            eprintln!("{}", weights.plan.describe(&range.label()));
        }
        Ok(Self { stage: Stage::new(cfg, weights, opts.options), tokenizer, ctx: opts.ctx })
    }

    pub fn cfg(&self) -> &Config { &self.stage.cfg }

    pub fn tokenizer(&self) -> Result<Arc<Tokenizer>, EngineError> {
        self.tokenizer.clone().ok_or_else(|| EngineError::Invalid("the model file carries no tokenizer".into()))
    }
}
