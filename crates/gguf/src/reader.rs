use crate::{GgmlType, GgufError, MetaValue};
use std::path::Path;

/// One entry of the tensor directory.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorInfo {
    pub name: String,
    pub ty: GgmlType,
    /// GGUF order: dims[0] is the contiguous (input) dimension.
    pub dims: Vec<u64>,
    /// Byte offset relative to the start of the data section.
    pub offset: u64,
    pub n_bytes: u64,
}

impl TensorInfo {
    pub fn n_elems(&self) -> u64 { self.dims.iter().product() }
}

/// A parsed GGUF file backed by a memory map (or owned bytes, for tests and fuzzing).
pub struct GgufFile {
    // filled by implementation
}

impl GgufFile {
    pub fn open(_path: impl AsRef<Path>) -> Result<Self, GgufError> { todo!() }
    pub fn from_bytes(_bytes: Vec<u8>) -> Result<Self, GgufError> { todo!() }
    pub fn version(&self) -> u32 { todo!() }
    pub fn alignment(&self) -> u64 { todo!() }
    /// Absolute file offset of the data section.
    pub fn data_offset(&self) -> u64 { todo!() }
    /// Metadata in file order.
    pub fn metadata(&self) -> &[(String, MetaValue)] { todo!() }
    pub fn get(&self, _key: &str) -> Option<&MetaValue> { todo!() }
    pub fn tensors(&self) -> &[TensorInfo] { todo!() }
    pub fn tensor(&self, _name: &str) -> Option<&TensorInfo> { todo!() }
    pub fn tensor_data(&self, _t: &TensorInfo) -> &[u8] { todo!() }
    /// Whole file bytes.
    pub fn bytes(&self) -> &[u8] { todo!() }
    // Typed accessors, widening as the C engine does. Missing key or wrong type -> GgufError::Meta naming the key.
    pub fn get_u32(&self, _key: &str) -> Result<u32, GgufError> { todo!() }
    pub fn get_u64(&self, _key: &str) -> Result<u64, GgufError> { todo!() }
    pub fn get_f32(&self, _key: &str) -> Result<f32, GgufError> { todo!() }
    pub fn get_bool(&self, _key: &str) -> Result<bool, GgufError> { todo!() }
    pub fn get_str(&self, _key: &str) -> Result<&str, GgufError> { todo!() }
    pub fn get_u32_array(&self, _key: &str) -> Result<Vec<u32>, GgufError> { todo!() }
    pub fn get_f32_array(&self, _key: &str) -> Result<Vec<f32>, GgufError> { todo!() }
    pub fn get_str_array(&self, _key: &str) -> Result<Vec<&str>, GgufError> { todo!() }
}
