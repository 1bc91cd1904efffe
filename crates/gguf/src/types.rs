/// ggml tensor types used by the DeepSeek V4 files (ids as in ggml).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[allow(non_camel_case_types)]
#[repr(u32)]
pub enum GgmlType {
    F32 = 0,
    F16 = 1,
    Q8_0 = 8,
    Q2_K = 10,
    Q4_K = 12,
    Q8_K = 15,
    IQ2_XXS = 16,
    I32 = 26,
    BF16 = 30,
}

impl GgmlType {
    pub fn from_u32(v: u32) -> Option<Self> {
        Some(match v {
            0 => Self::F32,
            1 => Self::F16,
            8 => Self::Q8_0,
            10 => Self::Q2_K,
            12 => Self::Q4_K,
            15 => Self::Q8_K,
            16 => Self::IQ2_XXS,
            26 => Self::I32,
            30 => Self::BF16,
            _ => return None,
        })
    }
    /// Elements per block.
    pub fn block_elems(self) -> usize {
        match self {
            Self::F32 | Self::F16 | Self::I32 | Self::BF16 => 1,
            Self::Q8_0 => 32,
            Self::Q2_K | Self::Q4_K | Self::Q8_K | Self::IQ2_XXS => 256,
        }
    }
    /// Bytes per block.
    pub fn block_bytes(self) -> usize {
        match self {
            Self::F32 | Self::I32 => 4,
            Self::F16 | Self::BF16 => 2,
            Self::Q8_0 => 34,
            Self::Q2_K => 84,
            Self::Q4_K => 144,
            Self::Q8_K => 292,
            Self::IQ2_XXS => 66,
        }
    }
    /// Bytes of a row of `n` elements, or None when `n` is not a multiple of the block size.
    pub fn row_bytes(self, n: usize) -> Option<usize> {
        if n % self.block_elems() != 0 {
            return None;
        }
        (n / self.block_elems()).checked_mul(self.block_bytes())
    }
    pub fn name(self) -> &'static str {
        match self {
            Self::F32 => "F32",
            Self::F16 => "F16",
            Self::Q8_0 => "Q8_0",
            Self::Q2_K => "Q2_K",
            Self::Q4_K => "Q4_K",
            Self::Q8_K => "Q8_K",
            Self::IQ2_XXS => "IQ2_XXS",
            Self::I32 => "I32",
            Self::BF16 => "BF16",
        }
    }
}
