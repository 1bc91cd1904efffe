//! Errors of the GPU stage: the checks it makes itself, and a backend's failures (named by the backend).
use thiserror::Error;

#[derive(Debug, Error)]
pub enum GpuError {
    #[error("batch of {n} tokens exceeds the prefill chunk {nmax} the buffers were sized for")]
    BatchTooLarge { n: usize, nmax: usize },
    #[error("context full: {pos} + {n} tokens exceeds ctx {ctx}")]
    ContextFull { pos: usize, n: usize, ctx: usize },
    #[error("token id {token} is outside the vocabulary ({vocab})")]
    TokenOutOfRange { token: u32, vocab: usize },
    #[error("hidden input has {got} floats, expected {want}")]
    HiddenSize { got: usize, want: usize },
    #[error("stage without embedding needs a hidden-state input")]
    NoEmbedding,
    #[error("the stage has no output head")]
    NoHead,
    #[error("the KV state at position {pos} is not on the device (device at {dev}, snapshot at {snap:?})")]
    StateNotOnDevice { pos: usize, dev: usize, snap: Option<usize> },
    #[error("the KV state is at position {pos}, beyond the context {ctx} the stage was sized for")]
    KvBeyondContext { pos: usize, ctx: usize },
    #[error("KV rollback to position {pos}: the journal covers {from}..={to}")]
    RollbackOutOfRange { pos: usize, from: usize, to: usize },
    #[error("{0}")]
    Journal(&'static str),
    #[error("a journaled step of {n} tokens: this backend undoes steps of at most {cap}")]
    JournalStepTooLong { n: usize, cap: usize },
    #[error("KV slot {slot} does not exist: the stage holds {slots} (slot 0 ..= {})", slots - 1)]
    SlotOutOfRange { slot: usize, slots: usize },
    #[error("a batch of {n} sequences exceeds the {slots} KV slots the stage was built with")]
    BatchOverSlots { n: usize, slots: usize },
    #[error("KV slot {slot} appears twice in one batch (a batch takes one token per sequence)")]
    SlotTwice { slot: usize },
    #[error("batch of {kvs} sequences with {tokens} tokens")]
    BatchMismatch { kvs: usize, tokens: usize },
    /// A failure inside the backend (a launch, a copy, an unsupported shape), in its words.
    #[error("{0}")]
    Device(String),
}

impl From<String> for GpuError {
    fn from(s: String) -> Self { GpuError::Device(s) }
}

impl From<&str> for GpuError {
    fn from(s: &str) -> Self { GpuError::Device(s.to_string()) }
}

pub type Result<T> = std::result::Result<T, GpuError>;
