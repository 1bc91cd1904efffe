//! Engine: model loading (with the embedded default), sessions, prefill/decode/generation, statistics.
#[cfg(feature = "cuda")]
mod cuda_pipeline;
mod default_model;
mod engine;
mod error;
pub mod membw;
mod session;

pub use default_model::{default_model_path, resolve_model, vocab_from_parts, ModelSource};
pub use engine::{Backend, CudaWeights, Engine, LoadOptions};
pub use error::EngineError;
pub use session::{GenStats, Session, StopReason};
