use thiserror::Error;

#[derive(Debug, Error, Clone)]
pub enum DistError {
    /// Bad command-line usage (binaries exit 2).
    #[error("{0}")]
    Usage(String),
    #[error("protocol: {0}")]
    Protocol(String),
    #[error("i/o: {0}")]
    Io(String),
    #[error("authentication: {0}")]
    Auth(String),
    /// The coordinator refused a registration.
    #[error("registration refused: {0}")]
    Rejected(String),
    /// A stage of the route failed; the message names it.
    #[error("{0}")]
    Stage(String),
    /// The route has no stage for some layer.
    #[error("route incomplete: {0}")]
    Incomplete(String),
    #[error("model: {0}")]
    Model(String),
    #[error("{0}")]
    Other(String),
}

impl From<ds4_model::ModelError> for DistError {
    fn from(e: ds4_model::ModelError) -> Self { DistError::Model(e.to_string()) }
}
impl From<ds4_gguf::GgufError> for DistError {
    fn from(e: ds4_gguf::GgufError) -> Self { DistError::Model(e.to_string()) }
}
impl From<ds4_engine::EngineError> for DistError {
    fn from(e: ds4_engine::EngineError) -> Self { DistError::Model(e.to_string()) }
}
impl From<std::io::Error> for DistError {
    fn from(e: std::io::Error) -> Self { DistError::Io(e.to_string()) }
}

pub type Result<T> = std::result::Result<T, DistError>;
