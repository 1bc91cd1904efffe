use thiserror::Error;

#[derive(Debug, Error)]
pub enum EngineError {
    #[error(transparent)]
    Model(#[from] ds4_model::ModelError),
    #[error(transparent)]
    Gguf(#[from] ds4_gguf::GgufError),
    #[error("tokenizer: {0}")]
    Tokenizer(#[from] ds4_tokenizer::TokenizerError),
    #[error("{0}")]
    Invalid(String),
    /// The memory plan does not fit the budget (refused at startup).
    #[error("{0}")]
    Budget(String),
    /// The backend does not implement this yet.
    #[error("{0}")]
    Unsupported(String),
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
}
