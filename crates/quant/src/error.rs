use thiserror::Error;

#[derive(Debug, Error)]
pub enum QuantError {
    #[error("type {ty}: {cols} columns is not a multiple of the block size")]
    BadShape { ty: &'static str, cols: usize },
    #[error("expected {expected} bytes, got {got}")]
    BadLength { expected: usize, got: usize },
    #[error("type {0} is not supported here")]
    Unsupported(&'static str),
}
