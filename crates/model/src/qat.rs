//! Simulation of the quantization-aware steps: FP8 E4M3 on KV rows, Hadamard + FP4 E2M1 on indexer rows.

/// Largest finite E4M3FN magnitude.
pub const E4M3_MAX: f32 = 448.0;
/// Largest E2M1 magnitude.
pub const E2M1_MAX: f32 = 6.0;

/// 2^ceil(log2(x)) for finite x > 0, computed exactly from the float's bits.
pub fn pow2_ceil(x: f32) -> f32 {
    let bits = x.to_bits();
    let exp = ((bits >> 23) & 0xff) as i32;
    let mant = bits & 0x7f_ffff;
    if exp == 0 {
        // Subnormal input: round up to the next power of two.
        let e = -149 + (32 - mant.leading_zeros() as i32);
        let p = if mant.is_power_of_two() { e - 1 } else { e };
        return 2f32.powi(p);
    }
    let e = exp - 127;
    let p = if mant == 0 { e } else { e + 1 };
    2f32.powi(p)
}

/// Rounds to the E4M3FN grid (|v| <= 448 expected), nearest, ties to even code.
pub fn e4m3_round(v: f32) -> f32 {
    let a = v.abs();
    if a == 0.0 || !a.is_finite() {
        return v;
    }
    let a = a.min(E4M3_MAX);
    // Spacing: subnormals 2^-9; normals 2^(e-3).
    let e = ((a.to_bits() >> 23) & 0xff) as i32 - 127;
    let step = if e < -6 { 2f32.powi(-9) } else { 2f32.powi(e - 3) };
    let r = ((a / step).round_ties_even() * step).min(E4M3_MAX);
    r.copysign(v)
}

/// Rounds to the E2M1 magnitudes {0, .5, 1, 1.5, 2, 3, 4, 6}, nearest, ties to even code.
pub fn e2m1_round(v: f32) -> f32 {
    let a = v.abs().min(E2M1_MAX);
    let r = if a < 2.0 {
        // Codes 0..4 are spaced 0.5 apart: even code = even multiple of 0.5.
        (a * 2.0).round_ties_even() * 0.5
    } else if a < 4.0 {
        // Codes 4 (2.0), 5 (3.0), 6 (4.0): spacing 1.
        a.round_ties_even()
    } else {
        // Codes 6 (4.0), 7 (6.0): tie at 5 goes to the even code 6 -> 4.0.
        if a <= 5.0 { 4.0 } else { 6.0 }
    };
    r.copysign(v)
}

/// Block-scaled FP8 E4M3 simulation in place (`block` elements share a power-of-two scale).
pub fn fp8_simulate(x: &mut [f32], block: usize) {
    for b in x.chunks_mut(block) {
        let amax = b.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-4);
        let s = pow2_ceil(amax / E4M3_MAX);
        for v in b.iter_mut() {
            *v = e4m3_round((*v / s).clamp(-E4M3_MAX, E4M3_MAX)) * s;
        }
    }
}

/// Block-scaled FP4 E2M1 simulation in place.
pub fn fp4_simulate(x: &mut [f32], block: usize) {
    let tiny = E2M1_MAX * f32::MIN_POSITIVE;
    for b in x.chunks_mut(block) {
        let amax = b.iter().fold(0f32, |m, v| m.max(v.abs())).max(tiny);
        let s = pow2_ceil(amax / E2M1_MAX);
        for v in b.iter_mut() {
            *v = e2m1_round((*v / s).clamp(-E2M1_MAX, E2M1_MAX)) * s;
        }
    }
}

/// Walsh–Hadamard transform (Sylvester order) scaled by 1/sqrt(n), computed in f64 and rounded once.
pub fn hadamard(x: &mut [f32]) {
    let n = x.len();
    debug_assert!(n.is_power_of_two());
    let mut buf = [0f64; 1024];
    let mut heap;
    let t: &mut [f64] = if n <= buf.len() {
        &mut buf[..n]
    } else {
        heap = vec![0f64; n];
        &mut heap
    };
    for (d, s) in t.iter_mut().zip(x.iter()) {
        *d = *s as f64;
    }
    let mut h = 1;
    while h < n {
        for i in (0..n).step_by(2 * h) {
            for j in i..i + h {
                let (a, b) = (t[j], t[j + h]);
                t[j] = a + b;
                t[j + h] = a - b;
            }
        }
        h *= 2;
    }
    let scale = 1.0 / (n as f64).sqrt();
    for (d, s) in x.iter_mut().zip(t.iter()) {
        *d = (*s * scale) as f32;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pow2_ceil_exact() {
        assert_eq!(pow2_ceil(1.0), 1.0);
        assert_eq!(pow2_ceil(1.0000001), 2.0);
        assert_eq!(pow2_ceil(0.75), 1.0);
        assert_eq!(pow2_ceil(0.5), 0.5);
        assert_eq!(pow2_ceil(3.0), 4.0);
    }

    #[test]
    fn e4m3_grid_points_are_fixed() {
        for v in [0.0, 1.0, 1.125, 448.0, -240.0, 2f32.powi(-9), 2f32.powi(-6)] {
            assert_eq!(e4m3_round(v), v);
        }
        // Tie between 1.0 and 1.125 goes to the even mantissa (1.0).
        assert_eq!(e4m3_round(1.0625), 1.0);
        assert_eq!(e4m3_round(1.1875), 1.25);
    }

    #[test]
    fn e2m1_ties_to_even_code() {
        assert_eq!(e2m1_round(0.25), 0.0);
        assert_eq!(e2m1_round(0.75), 1.0);
        assert_eq!(e2m1_round(1.25), 1.0);
        assert_eq!(e2m1_round(1.75), 2.0);
        assert_eq!(e2m1_round(2.5), 2.0);
        assert_eq!(e2m1_round(3.5), 4.0);
        assert_eq!(e2m1_round(5.0), 4.0);
        assert_eq!(e2m1_round(-5.5), -6.0);
    }
}
