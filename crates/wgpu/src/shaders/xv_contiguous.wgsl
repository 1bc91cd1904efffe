// A unit's activations are contiguous: vec4 i of unit u is vec4 u * XV + i of the activation row
// (every type's `dotu` but Q2_K's, whose unit takes 8 values of each of its 4 planes).
fn xv_at(u: u32, i: u32) -> u32 { return u * XV + i; }
