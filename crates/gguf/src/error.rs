use thiserror::Error;

#[derive(Debug, Error)]
pub enum GgufError {
    #[error("i/o error on {path}: {source}")]
    Io { path: String, #[source] source: std::io::Error },
    #[error("invalid GGUF: {0}")]
    Invalid(String),
    #[error("metadata key `{key}`: {problem}")]
    Meta { key: String, problem: String },
    #[error("tensor `{name}`: {problem}")]
    Tensor { name: String, problem: String },
}
