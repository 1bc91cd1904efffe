//! Q2_K and Q4_K quantizers (ggml's reference algorithms, no importance matrix).
pub fn quantize_row_q2_k(_x: &[f32], _out: &mut [u8]) { todo!() }
pub fn quantize_row_q4_k(_x: &[f32], _out: &mut [u8]) { todo!() }
