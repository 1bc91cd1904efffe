//! Quantizers vs ggml's C quantizers (ggml-python fixtures from tools/reference/quant_fixtures.py).
mod common;

use ds4_quant::{dequantize, quantize, GgmlType};

fn rel_err(ty: GgmlType, q: &[u8], src: &[f32]) -> f64 {
    let mut d = vec![0f32; src.len()];
    dequantize(ty, q, &mut d).unwrap();
    let num: f64 = d.iter().zip(src).map(|(&a, &b)| ((a - b) as f64).powi(2)).sum();
    let den: f64 = src.iter().map(|&b| (b as f64).powi(2)).sum();
    (num / den).sqrt()
}

/// Our quantizer's output vs ggml's: (number of differing blocks, total blocks).
fn compare(name: &str, ty: GgmlType, ours: &[u8], ggml: &[u8]) -> (usize, usize) {
    assert_eq!(ours.len(), ggml.len(), "{name}: length");
    let bb = ty.block_bytes();
    let mut diff = 0;
    for (i, (a, b)) in ours.chunks(bb).zip(ggml.chunks(bb)).enumerate() {
        if a != b {
            diff += 1;
            eprintln!("{name}: block {i} differs from ggml");
        }
    }
    (diff, ours.len() / bb)
}

#[test]
fn q8_0_q8_k_q2_k_q4_k_bit_exact_vs_ggml() {
    let recs = common::load("quantize.bin");
    for want in [GgmlType::Q8_0, GgmlType::Q8_K, GgmlType::Q2_K, GgmlType::Q4_K] {
        let r = recs.iter().find(|r| r.ty == want as u32).unwrap_or_else(|| panic!("no fixture {want:?}"));
        let src = r.f32s("src");
        let ours = quantize(want, &src).unwrap();
        let (diff, total) = compare(&r.name, want, &ours, r.bytes("q"));
        assert_eq!(diff, 0, "{}: {diff}/{total} blocks differ from ggml", r.name);
    }
}
