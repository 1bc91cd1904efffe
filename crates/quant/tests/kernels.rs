//! Every kernel table available on this machine (force-selected) agrees with the scalar
//! reference, and the scalar reference agrees with an f64 dot of the dequantized operands.
use ds4_quant::random::SplitMix64;
use ds4_quant::{
    dequantize, quantize_row_q8_0, quantize_row_q8_k, random_valid_blocks, GgmlType, Isa, Kernels,
};

const QTYPES: [GgmlType; 4] = [GgmlType::Q8_0, GgmlType::Q2_K, GgmlType::Q4_K, GgmlType::IQ2_XXS];
const FTYPES: [GgmlType; 3] = [GgmlType::F32, GgmlType::F16, GgmlType::BF16];

fn act_type(ty: GgmlType) -> GgmlType {
    if ty == GgmlType::Q8_0 { GgmlType::Q8_0 } else { GgmlType::Q8_K }
}

fn qdot(k: &Kernels, ty: GgmlType) -> ds4_quant::kernels::DotQ {
    match ty {
        GgmlType::Q8_0 => k.q8_0,
        GgmlType::Q2_K => k.q2_k,
        GgmlType::Q4_K => k.q4_k,
        _ => k.iq2_xxs,
    }
}

fn fdot(k: &Kernels, ty: GgmlType) -> ds4_quant::kernels::DotF {
    match ty {
        GgmlType::F32 => k.f32,
        GgmlType::F16 => k.f16,
        _ => k.bf16,
    }
}

fn randn(seed: u64, n: usize) -> Vec<f32> {
    let mut r = SplitMix64(seed);
    (0..n).map(|_| r.normal()).collect()
}

fn quant_act(ty: GgmlType, x: &[f32]) -> Vec<u8> {
    let at = act_type(ty);
    let mut a = vec![0u8; at.row_bytes(x.len()).unwrap()];
    if at == GgmlType::Q8_0 { quantize_row_q8_0(x, &mut a) } else { quantize_row_q8_k(x, &mut a) }
    a
}

/// (f64 dot of dequantized operands, sum of |products|)
fn f64_ref(ty: GgmlType, w: &[u8], aty: GgmlType, a: &[u8], cols: usize) -> (f64, f64) {
    let mut wd = vec![0f32; cols];
    let mut ad = vec![0f32; cols];
    dequantize(ty, w, &mut wd).unwrap();
    dequantize(aty, a, &mut ad).unwrap();
    let s = wd.iter().zip(&ad).map(|(&p, &q)| p as f64 * q as f64).sum();
    let m = wd.iter().zip(&ad).map(|(&p, &q)| (p as f64 * q as f64).abs()).sum();
    (s, m)
}

#[test]
fn scalar_quant_kernels_match_f64_dot_of_dequantized() {
    let k = Kernels::for_isa(Isa::Scalar).unwrap();
    for ty in QTYPES {
        for nblk in [1usize, 3, 5] {
            let cols = nblk * ty.block_elems() * if ty == GgmlType::Q8_0 { 8 } else { 1 };
            let w = random_valid_blocks(ty, 7 + nblk as u64, cols / ty.block_elems());
            let a = quant_act(ty, &randn(99 + nblk as u64, cols));
            let got = qdot(k, ty)(&w, &a) as f64;
            let (want, mag) = f64_ref(ty, &w, act_type(ty), &a, cols);
            assert!((got - want).abs() <= 1e-5 * mag + 1e-9, "{ty:?} cols={cols}: {got} vs {want}");
        }
    }
}

#[test]
fn simd_kernels_match_scalar() {
    let s = Kernels::for_isa(Isa::Scalar).unwrap();
    let mut tested = 0;
    for &isa in Isa::simd_of_arch() {
        let Some(k) = Kernels::for_isa(isa) else {
            eprintln!("{isa:?} not available on this machine; skipped");
            continue;
        };
        assert_eq!(k.isa, isa);
        tested += 1;
        for ty in QTYPES {
            // Odd block counts too: Q8_0 pairs blocks per 512-bit register (odd tail), the
            // 256-element types run one block per iteration.
            let sizes: &[usize] = if ty == GgmlType::Q8_0 {
                &[32, 96, 32 * 7, 256 * 3, 32 * 129, 4096]
            } else {
                &[256, 256 * 3, 256 * 7, 256 * 13, 4096]
            };
            for &cols in sizes {
                for seed in 0..4u64 {
                    let w = random_valid_blocks(ty, seed * 31 + cols as u64, cols / ty.block_elems());
                    let a = quant_act(ty, &randn(seed + 1000, cols));
                    let want = qdot(s, ty)(&w, &a);
                    let got = qdot(k, ty)(&w, &a);
                    let (_, mag) = f64_ref(ty, &w, act_type(ty), &a, cols);
                    assert!(
                        ((got - want) as f64).abs() <= 1e-5 * mag + 1e-9,
                        "{isa:?} {ty:?} cols={cols} seed={seed}: {got} vs scalar {want}"
                    );
                }
            }
        }
        for ty in FTYPES {
            for cols in [1usize, 7, 8, 31, 32, 33, 255, 256 * 3, 1001] {
                let w = random_valid_blocks(ty, cols as u64, cols);
                let x = randn(cols as u64 + 5, cols);
                let want = fdot(s, ty)(&w, &x);
                let got = fdot(k, ty)(&w, &x);
                let mut wd = vec![0f32; cols];
                dequantize(ty, &w, &mut wd).unwrap();
                let mag: f64 = wd.iter().zip(&x).map(|(&p, &q)| (p as f64 * q as f64).abs()).sum();
                assert!(((got - want) as f64).abs() <= 1e-5 * mag + 1e-9, "{isa:?} {ty:?} cols={cols}: {got} vs {want}");
            }
        }
    }
    if std::env::var("DS4_REQUIRE_SIMD").is_ok() {
        assert_eq!(tested, Isa::simd_of_arch().len(), "expected every SIMD kernel table of this architecture");
    }
}

/// The several-row kernels (prefill, batches, MTP verify rows) give each row exactly the one-row
/// kernel's bits, for 1 to 4 rows `stride` bytes apart with a gap between them (a kernel reading at
/// the row length instead of the stride, or mixing rows, fails), odd block counts included (NEON's
/// Q8_0 takes blocks four at a time).
#[test]
fn row_kernels_equal_one_row_kernels() {
    let mut tested = 0;
    for isa in Isa::all() {
        let Some(k) = Kernels::for_isa(isa) else { continue };
        let forms = [(GgmlType::Q8_0, k.q8_0_rows), (GgmlType::Q2_K, k.q2_k_rows), (GgmlType::Q4_K, k.q4_k_rows), (GgmlType::IQ2_XXS, k.iq2_xxs_rows)];
        for (ty, rows_fn) in forms {
            let Some(rows_fn) = rows_fn else { continue };
            tested += 1;
            let blocks: &[usize] = if ty == GgmlType::Q8_0 { &[1, 3, 4, 5, 7, 129] } else { &[1, 3, 16] };
            for &nb in blocks {
                let cols = nb * ty.block_elems();
                let w = random_valid_blocks(ty, 11 + nb as u64, nb);
                let rows: Vec<Vec<u8>> = (0..4).map(|t| quant_act(ty, &randn(500 + 10 * nb as u64 + t, cols))).collect();
                let stride = rows[0].len() + 37;
                let mut a = vec![0xA5u8; 4 * stride];
                for (t, r) in rows.iter().enumerate() {
                    a[t * stride..t * stride + r.len()].copy_from_slice(r);
                }
                for n in 1..=ds4_quant::kernels::MAX_ROWS {
                    let mut got = vec![f32::NAN; n];
                    rows_fn(&w, &a[..(n - 1) * stride + rows[0].len()], stride, &mut got);
                    for t in 0..n {
                        let want = qdot(k, ty)(&w, &rows[t]);
                        assert_eq!(got[t].to_bits(), want.to_bits(), "{isa:?} {ty:?} blocks={nb} {n} rows, row {t}: {} vs {want}", got[t]);
                    }
                }
            }
        }
    }
    if std::env::var("DS4_REQUIRE_SIMD").is_ok() && !Isa::simd_of_arch().is_empty() {
        assert!(tested >= 4, "no several-row kernels tested");
    }
}
