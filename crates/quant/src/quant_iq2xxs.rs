//! IQ2_XXS quantizer.
pub fn quantize_row_iq2_xxs(_x: &[f32], _out: &mut [u8], _imatrix: Option<&[f32]>) { todo!() }
