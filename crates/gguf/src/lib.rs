//! GGUF v3 container: zero-copy reader over memmap2, streaming writer, tensor types.
//! API CONTRACT (other crates code against this; keep signatures stable):
//!
//! - `GgmlType` (repr u32 ids as in ggml), `block_elems()`, `block_bytes()`, `row_bytes(n)`, `name()`.
//! - `MetaValue` with every GGUF value type, nested arrays.
//! - `TensorInfo { name, ty, dims, offset, n_bytes }` (offset relative to the data section).
//! - `GgufFile::open(path)`, `GgufFile::from_bytes(Vec<u8>)`, `.metadata()`, `.get(key)`,
//!   typed accessors with widening, `.tensors()`, `.tensor(name)`, `.tensor_data(&TensorInfo) -> &[u8]`.
//! - `GgufWriter` (two phase: declare metadata + tensor infos, then stream tensor bytes in order).
mod types;
mod value;
mod reader;
mod writer;
mod error;

pub use error::GgufError;
pub use types::GgmlType;
pub use value::{Abbrev, MetaType, MetaValue};
pub use reader::{
    tensor_n_bytes, GgufFile, TensorInfo, DEFAULT_ALIGNMENT, GGUF_MAGIC, GGUF_VERSION, MAX_ARRAY_DEPTH,
    MAX_DIMS, MAX_META_VALUES,
};
pub use writer::{GgufWriter, TensorStream};
