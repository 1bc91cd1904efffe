//! Property tests: quantize → dequantize stays within per-format error bounds.
use ds4_quant::{dequantize, quantize, GgmlType};
use proptest::prelude::*;

fn roundtrip(ty: GgmlType, x: &[f32]) -> Vec<f32> {
    let q = quantize(ty, x).unwrap();
    assert_eq!(q.len(), ty.row_bytes(x.len()).unwrap());
    let mut d = vec![0f32; x.len()];
    dequantize(ty, &q, &mut d).unwrap();
    d
}

fn rms(v: impl Iterator<Item = f32>) -> f64 {
    let (s, n) = v.fold((0f64, 0usize), |(s, n), x| (s + (x as f64).powi(2), n + 1));
    (s / n.max(1) as f64).sqrt()
}

fn vec_strategy(blocks: usize, bs: usize) -> impl Strategy<Value = Vec<f32>> {
    (1..=blocks, 1e-3f32..100.0).prop_flat_map(move |(nb, r)| prop::collection::vec(-r..r, nb * bs))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn q8_0_error_within_half_step(x in vec_strategy(8, 32)) {
        let d = roundtrip(GgmlType::Q8_0, &x);
        for (xb, db) in x.chunks(32).zip(d.chunks(32)) {
            let amax = xb.iter().fold(0f32, |m, v| m.max(v.abs()));
            // half a step of amax/127, plus the f16 rounding of the scale (≤ 2^-11 relative).
            let bound = 0.5 * amax / 127.0 + amax * 2f32.powi(-11) * 1.01 + 1e-30;
            for (a, b) in xb.iter().zip(db) {
                prop_assert!((a - b).abs() <= bound, "{a} vs {b} bound {bound}");
            }
        }
    }

    #[test]
    fn q8_k_error_within_half_step(x in vec_strategy(3, 256)) {
        let d = roundtrip(GgmlType::Q8_K, &x);
        for (xb, db) in x.chunks(256).zip(d.chunks(256)) {
            let amax = xb.iter().fold(0f32, |m, v| m.max(v.abs()));
            let bound = 0.5 * amax / 127.0 * 1.0001;
            for (a, b) in xb.iter().zip(db) {
                prop_assert!((a - b).abs() <= bound, "{a} vs {b}");
            }
        }
    }

    #[test]
    fn k_quants_and_iq2_xxs_rms_error_bounded(x in vec_strategy(3, 256)) {
        // Uniform data: ideal uniform quantizers give rms(err)/rms(x) = 1/(levels-1)
        // (4-bit: 0.067, 2-bit: 0.33); allow for scale coding overhead.
        for (ty, bound) in [(GgmlType::Q4_K, 0.10), (GgmlType::Q2_K, 0.45), (GgmlType::IQ2_XXS, 0.60)] {
            let d = roundtrip(ty, &x);
            let e = rms(x.iter().zip(&d).map(|(a, b)| a - b)) / rms(x.iter().copied());
            prop_assert!(e <= bound, "{ty:?}: rel rms err {e}");
        }
    }

    #[test]
    fn f16_bf16_relative_rounding(x in prop::collection::vec(-1e4f32..1e4, 1..300)) {
        for (ty, rel) in [(GgmlType::F16, 2f32.powi(-11)), (GgmlType::BF16, 2f32.powi(-8)), (GgmlType::F32, 0.0)] {
            let d = roundtrip(ty, &x);
            for (a, b) in x.iter().zip(&d) {
                // F16: values below the normal range lose relative precision; add 2^-25 absolute.
                prop_assert!((a - b).abs() <= rel * a.abs() + 2f32.powi(-25), "{ty:?}: {a} vs {b}");
            }
        }
    }
}
