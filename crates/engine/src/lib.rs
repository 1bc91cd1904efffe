//! Engine: model loading (with the embedded default), sessions, prefill/decode/generation, statistics.
#[cfg(feature = "cuda")]
mod cuda_pipeline;
mod default_model;
mod engine;
mod error;
pub mod logprobs;
pub mod membw;
mod progress;
mod session;
pub mod speculative;

pub use default_model::{default_model_path, resolve_model, vocab_from_parts, ModelSource};
pub use ds4_model::hostload::WeightMemory;
pub use engine::{Backend, CudaWeights, Engine, LoadOptions, LoadPlan};
pub use error::EngineError;
pub use session::{GenStats, Session, SessionSnapshot, StopReason};
pub use speculative::{MtpEngine, MtpOptions, SpecSampler};
