use std::fmt;

/// GGUF metadata value type ids.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum MetaType {
    U8 = 0, I8 = 1, U16 = 2, I16 = 3, U32 = 4, I32 = 5, F32 = 6, Bool = 7, Str = 8, Array = 9,
    U64 = 10, I64 = 11, F64 = 12,
}

impl MetaType {
    /// Type from its GGUF id, or None for an unknown id.
    pub fn from_u32(v: u32) -> Option<Self> {
        Some(match v {
            0 => Self::U8,
            1 => Self::I8,
            2 => Self::U16,
            3 => Self::I16,
            4 => Self::U32,
            5 => Self::I32,
            6 => Self::F32,
            7 => Self::Bool,
            8 => Self::Str,
            9 => Self::Array,
            10 => Self::U64,
            11 => Self::I64,
            12 => Self::F64,
            _ => return None,
        })
    }

    /// Lower-case GGUF name of the type (`u32`, `str`, `array`, ...).
    pub fn name(self) -> &'static str {
        match self {
            Self::U8 => "u8",
            Self::I8 => "i8",
            Self::U16 => "u16",
            Self::I16 => "i16",
            Self::U32 => "u32",
            Self::I32 => "i32",
            Self::F32 => "f32",
            Self::Bool => "bool",
            Self::Str => "str",
            Self::Array => "array",
            Self::U64 => "u64",
            Self::I64 => "i64",
            Self::F64 => "f64",
        }
    }

    /// Size in bytes of a fixed-size scalar of this type; None for strings and arrays.
    pub fn fixed_size(self) -> Option<usize> {
        match self {
            Self::U8 | Self::I8 | Self::Bool => Some(1),
            Self::U16 | Self::I16 => Some(2),
            Self::U32 | Self::I32 | Self::F32 => Some(4),
            Self::U64 | Self::I64 | Self::F64 => Some(8),
            Self::Str | Self::Array => None,
        }
    }

    /// Smallest number of bytes one value of this type can take inside an array
    /// (a string is at least its 8-byte length; a nested array at least type + count).
    pub fn min_encoded_size(self) -> usize {
        match self {
            Self::Str => 8,
            Self::Array => 12,
            other => other.fixed_size().unwrap_or(1),
        }
    }

    pub fn is_integer(self) -> bool {
        matches!(
            self,
            Self::U8 | Self::I8 | Self::U16 | Self::I16 | Self::U32 | Self::I32 | Self::U64 | Self::I64
        )
    }
}

impl fmt::Display for MetaType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One metadata value. Arrays keep their element type so an empty array round-trips.
#[derive(Debug, Clone, PartialEq)]
pub enum MetaValue {
    U8(u8), I8(i8), U16(u16), I16(i16), U32(u32), I32(i32), F32(f32), Bool(bool), Str(String),
    Array(MetaType, Vec<MetaValue>),
    U64(u64), I64(i64), F64(f64),
}

impl MetaValue {
    /// The GGUF type of this value (`Array` for arrays; see [`MetaValue::array_elem_type`]).
    pub fn meta_type(&self) -> MetaType {
        match self {
            Self::U8(_) => MetaType::U8,
            Self::I8(_) => MetaType::I8,
            Self::U16(_) => MetaType::U16,
            Self::I16(_) => MetaType::I16,
            Self::U32(_) => MetaType::U32,
            Self::I32(_) => MetaType::I32,
            Self::F32(_) => MetaType::F32,
            Self::Bool(_) => MetaType::Bool,
            Self::Str(_) => MetaType::Str,
            Self::Array(..) => MetaType::Array,
            Self::U64(_) => MetaType::U64,
            Self::I64(_) => MetaType::I64,
            Self::F64(_) => MetaType::F64,
        }
    }

    /// Element type of an array value.
    pub fn array_elem_type(&self) -> Option<MetaType> {
        match self {
            Self::Array(t, _) => Some(*t),
            _ => None,
        }
    }

    /// Human-readable type, e.g. `u32`, `array<str>`, `array<array<i32>>` (`array<array<mixed>>` when the
    /// nested arrays differ in type).
    pub fn type_name(&self) -> String {
        match self {
            Self::Array(t, items) => {
                if *t == MetaType::Array {
                    let first = items.first().map(|f| f.type_name());
                    match first {
                        Some(f) if items.iter().skip(1).all(|it| it.type_name() == f) => format!("array<{f}>"),
                        Some(_) => "array<array<mixed>>".to_string(),
                        None => "array<array>".to_string(),
                    }
                } else {
                    format!("array<{}>", t.name())
                }
            }
            other => other.meta_type().name().to_string(),
        }
    }

    /// Integer value as i128 (exact for every GGUF integer type); None for non-integers.
    pub fn as_int(&self) -> Option<i128> {
        Some(match *self {
            Self::U8(v) => v as i128,
            Self::I8(v) => v as i128,
            Self::U16(v) => v as i128,
            Self::I16(v) => v as i128,
            Self::U32(v) => v as i128,
            Self::I32(v) => v as i128,
            Self::U64(v) => v as i128,
            Self::I64(v) => v as i128,
            _ => return None,
        })
    }

    /// Any integer that fits in u32.
    pub fn as_u32(&self) -> Option<u32> {
        self.as_int().and_then(|v| u32::try_from(v).ok())
    }

    /// Any integer that fits in u64.
    pub fn as_u64(&self) -> Option<u64> {
        self.as_int().and_then(|v| u64::try_from(v).ok())
    }

    /// Any integer that fits in i64.
    pub fn as_i64(&self) -> Option<i64> {
        self.as_int().and_then(|v| i64::try_from(v).ok())
    }

    /// Any float or integer, as f64.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Self::F32(v) => Some(v as f64),
            Self::F64(v) => Some(v),
            _ => self.as_int().map(|v| v as f64),
        }
    }

    /// Any float or integer, as f32 (f64 narrowed as the C engine does).
    pub fn as_f32(&self) -> Option<f32> {
        match *self {
            Self::F32(v) => Some(v),
            _ => self.as_f64().map(|v| v as f32),
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            Self::Bool(b) => Some(b),
            _ => None,
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Self::Str(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&[MetaValue]> {
        match self {
            Self::Array(_, items) => Some(items),
            _ => None,
        }
    }

    /// Display with arrays abbreviated to their first `max_items` elements.
    pub fn display_abbrev(&self, max_items: usize) -> Abbrev<'_> {
        Abbrev { v: self, max_items }
    }
}

/// [`MetaValue`] display helper that abbreviates long arrays (see [`MetaValue::display_abbrev`]).
pub struct Abbrev<'a> {
    v: &'a MetaValue,
    max_items: usize,
}

fn write_value(f: &mut fmt::Formatter<'_>, v: &MetaValue, max_items: usize) -> fmt::Result {
    match v {
        MetaValue::U8(x) => write!(f, "{x}"),
        MetaValue::I8(x) => write!(f, "{x}"),
        MetaValue::U16(x) => write!(f, "{x}"),
        MetaValue::I16(x) => write!(f, "{x}"),
        MetaValue::U32(x) => write!(f, "{x}"),
        MetaValue::I32(x) => write!(f, "{x}"),
        MetaValue::U64(x) => write!(f, "{x}"),
        MetaValue::I64(x) => write!(f, "{x}"),
        MetaValue::F32(x) => write!(f, "{x:?}"),
        MetaValue::F64(x) => write!(f, "{x:?}"),
        MetaValue::Bool(x) => write!(f, "{x}"),
        MetaValue::Str(s) => write!(f, "{s:?}"),
        MetaValue::Array(_, items) => {
            f.write_str("[")?;
            for (i, it) in items.iter().take(max_items).enumerate() {
                if i > 0 {
                    f.write_str(", ")?;
                }
                write_value(f, it, max_items)?;
            }
            if items.len() > max_items {
                write!(f, ", ... ({} more)", items.len() - max_items)?;
            }
            f.write_str("]")
        }
    }
}

impl fmt::Display for Abbrev<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_value(f, self.v, self.max_items)
    }
}

/// Full display (strings quoted and escaped, arrays complete).
impl fmt::Display for MetaValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_value(f, self, usize::MAX)
    }
}
