use thiserror::Error;

/// Errors from building or using the tokenizer. Never a panic: every bad input maps here.
#[derive(Debug, Error)]
pub enum TokenizerError {
    #[error("unsupported tokenizer.ggml.pre `{0}` (supported: joyai-llm, deepseek-v3)")]
    UnsupportedPre(String),
    #[error("unsupported tokenizer.ggml.model `{0}` (expected gpt2)")]
    UnsupportedModel(String),
    #[error("bad vocabulary: {0}")]
    Vocab(String),
    #[error("bad merge #{index} `{merge}`: {problem}")]
    Merge { index: usize, merge: String, problem: String },
    #[error("GGUF metadata: {0}")]
    Gguf(#[from] ds4_gguf::GgufError),
    #[error("tokenizers: {0}")]
    Backend(String),
    #[error("embedded asset: {0}")]
    Asset(String),
}
