/// GGUF metadata value type ids.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum MetaType {
    U8 = 0, I8 = 1, U16 = 2, I16 = 3, U32 = 4, I32 = 5, F32 = 6, Bool = 7, Str = 8, Array = 9,
    U64 = 10, I64 = 11, F64 = 12,
}

/// One metadata value. Arrays keep their element type so an empty array round-trips.
#[derive(Debug, Clone, PartialEq)]
pub enum MetaValue {
    U8(u8), I8(i8), U16(u16), I16(i16), U32(u32), I32(i32), F32(f32), Bool(bool), Str(String),
    Array(MetaType, Vec<MetaValue>),
    U64(u64), I64(i64), F64(f64),
}
