//! Dequantization is bit-exact vs gguf-py (fixtures from tools/reference/quant_fixtures.py).
mod common;

use ds4_quant::{dequantize, GgmlType};

#[test]
fn dequant_bit_exact_vs_gguf_py() {
    let recs = common::load("dequant.bin");
    let mut seen = std::collections::HashSet::new();
    for r in &recs {
        let ty = GgmlType::from_u32(r.ty).unwrap();
        let want = r.f32s("f32");
        let mut got = vec![f32::NAN; want.len()];
        dequantize(ty, r.bytes("raw"), &mut got).unwrap();
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(g.to_bits(), w.to_bits(), "{}: element {i}: got {g}, gguf-py {w}", r.name);
        }
        seen.insert(ty);
    }
    for ty in [GgmlType::F16, GgmlType::BF16, GgmlType::F32, GgmlType::Q8_0, GgmlType::Q2_K, GgmlType::Q4_K, GgmlType::IQ2_XXS] {
        assert!(seen.contains(&ty), "no fixture for {ty:?}");
    }
}

#[test]
fn dequant_rejects_bad_shapes() {
    let mut out = vec![0f32; 100];
    assert!(dequantize(GgmlType::Q4_K, &[0u8; 144], &mut out).is_err());
    let mut out = vec![0f32; 256];
    assert!(dequantize(GgmlType::Q4_K, &[0u8; 100], &mut out).is_err());
}
