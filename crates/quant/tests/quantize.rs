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

/// Weighted relative error sqrt(Σ im·(q−x)² / Σ im·x²).
fn wrel_err(q: &[u8], src: &[f32], im: &[f32]) -> f64 {
    let mut d = vec![0f32; src.len()];
    dequantize(GgmlType::IQ2_XXS, q, &mut d).unwrap();
    let n = im.len();
    let (mut num, mut den) = (0f64, 0f64);
    for (i, (&a, &b)) in d.iter().zip(src).enumerate() {
        num += im[i % n] as f64 * ((a - b) as f64).powi(2);
        den += im[i % n] as f64 * (b as f64).powi(2);
    }
    (num / den).sqrt()
}

/// Our IQ2_XXS quantizer is not ggml's algorithm: we compare quality, not bytes.
#[test]
fn iq2_xxs_error_close_to_ggml() {
    for r in common::load("quantize.bin").iter().filter(|r| r.ty == GgmlType::IQ2_XXS as u32) {
        let src = r.f32s("src");
        let im = r.f32s("imatrix");
        let npr = r.u32("n_per_row") as usize;
        let ours = ds4_quant::quantize_iq2_xxs(&src, npr, Some(&im));
        let (e_ours, e_ggml) = (wrel_err(&ours, &src, &im), wrel_err(r.bytes("q"), &src, &im));
        let (u_ours, u_ggml) = (rel_err(GgmlType::IQ2_XXS, &ours, &src), rel_err(GgmlType::IQ2_XXS, r.bytes("q"), &src));
        eprintln!("{}: weighted rel err ours {e_ours:.4} ggml {e_ggml:.4}; plain ours {u_ours:.4} ggml {u_ggml:.4}", r.name);
        assert!(e_ours <= 1.10 * e_ggml, "{}: ours {e_ours} vs ggml {e_ggml}", r.name);
    }
}
