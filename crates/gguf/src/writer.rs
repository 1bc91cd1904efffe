use crate::{GgmlType, GgufError, MetaValue};
use std::path::Path;

/// Two-phase GGUF v3 writer: declare metadata and tensors, then stream tensor bytes in declaration order
/// (so multi-GB synthetic models never sit in memory).
pub struct GgufWriter {
    // filled by implementation
}

impl GgufWriter {
    pub fn new() -> Self { todo!() }
    pub fn set_alignment(&mut self, _align: u64) { todo!() }
    pub fn add_kv(&mut self, _key: &str, _value: MetaValue) { todo!() }
    /// Declare a tensor; its byte size is computed from type and dims.
    pub fn add_tensor_info(&mut self, _name: &str, _ty: GgmlType, _dims: &[u64]) -> Result<(), GgufError> { todo!() }
    /// Write header + directory; returns the stream that takes tensor data in order.
    pub fn begin(self, _path: impl AsRef<Path>) -> Result<TensorStream, GgufError> { todo!() }
}

/// Receives the bytes of each declared tensor in order; may be called several times per tensor
/// (chunks) — the tensor is complete when its declared byte count is reached.
pub struct TensorStream {
    // filled by implementation
}

impl TensorStream {
    pub fn write(&mut self, _bytes: &[u8]) -> Result<(), GgufError> { todo!() }
    /// Checks that every tensor got exactly its bytes, flushes and fsyncs.
    pub fn finish(self) -> Result<(), GgufError> { todo!() }
}
