use thiserror::Error;

#[derive(Debug, Error)]
pub enum ModelError {
    #[error(transparent)]
    Gguf(#[from] ds4_gguf::GgufError),
    #[error(transparent)]
    Quant(#[from] ds4_quant::QuantError),
    #[error("metadata `{key}`: {problem}")]
    Config { key: String, problem: String },
    #[error("tensor `{name}`: {problem}")]
    Tensor { name: String, problem: String },
    #[error("{0}")]
    Invalid(String),
}

pub type Result<T> = std::result::Result<T, ModelError>;

pub(crate) fn cfg_err(key: &str, problem: impl Into<String>) -> ModelError {
    ModelError::Config { key: key.to_string(), problem: problem.into() }
}
