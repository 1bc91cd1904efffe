//! Engine: model loading (with the embedded default), sessions, prefill/decode/generation, statistics.
mod backend;
#[cfg(feature = "cuda")]
mod cuda_pipeline;
mod default_model;
mod device_stage;
mod drafter;
mod engine;
mod error;
pub mod logprobs;
pub mod membw;
pub mod power;
mod progress;
mod session;
pub mod speculative;
#[cfg(feature = "wgpu")]
mod wgpu_stage;

pub use default_model::{default_model_path, resolve_model, vocab_from_parts, ModelSource};
pub use ds4_model::hostload::WeightMemory;
pub use backend::{probe_wgpu, AdapterKind, Backend};
pub use engine::{CudaWeights, Engine, LoadOptions, LoadPlan, MAX_CTX, MAX_SESSIONS, MAX_THREADS};
pub use error::EngineError;
pub use session::{GenStats, Session, SessionSnapshot, StopReason};
pub use speculative::{MtpEngine, MtpOptions, ScriptedDrafts, SpecSampler};
