//! DeepSeek V4 model: config, weights, forward pass, KV state, synthetic models.
pub mod attention;
pub mod batch;
pub mod compressor;
pub mod config;
pub mod error;
pub mod hc;
pub mod hostload;
pub mod imatrix;
pub mod kv;
pub mod mapplan;
pub mod memplan;
pub mod moe;
pub mod mtp;
pub mod ops;
pub mod qat;
pub mod residency;
pub mod rope;
pub mod shard;
pub mod stage;
pub mod steering;
pub mod synth;
pub mod weights;

pub use config::Config;
pub use error::{ModelError, Result};
pub use kv::KvState;
pub use stage::{Logits, Options, Stage};
pub use weights::{LayerRange, Weights};
