//! Dot-product kernels (weight row × activation row) and runtime ISA dispatch.

use std::sync::OnceLock;

// Safe entry points of a SIMD table's kernels, defined before the ISA modules so they can use them.
// Each is only handed out through `Kernels::for_isa($isa)`, which detects the table's CPU features
// at run time first.
#[allow(unused_macros)]
macro_rules! entry {
    ($isa:ident, $pub:ident, $imp:ident, $act:ty) => {
        pub(crate) fn $pub(w: &[u8], a: &$act) -> f32 {
            debug_assert!(crate::kernels::Isa::$isa.available());
            // SAFETY: only handed out after the table's features were detected at run time.
            unsafe { $imp(w, a) }
        }
    };
}

// The entries of an N-row kernel body: the table's one-row kernel and its 1-to-4-row form.
#[allow(unused_macros)]
macro_rules! entry_n {
    ($isa:ident, $one:ident, $rows:ident, $imp:ident) => {
        pub(crate) fn $one(w: &[u8], a: &[u8]) -> f32 {
            debug_assert!(crate::kernels::Isa::$isa.available());
            // SAFETY: only handed out after the table's features were detected at run time.
            unsafe { $imp::<1>(w, a, 0)[0] }
        }
        pub(crate) fn $rows(w: &[u8], a: &[u8], stride: usize, out: &mut [f32]) {
            debug_assert!(crate::kernels::Isa::$isa.available());
            // SAFETY: as above.
            unsafe {
                match out.len() {
                    1 => out.copy_from_slice(&$imp::<1>(w, a, stride)),
                    2 => out.copy_from_slice(&$imp::<2>(w, a, stride)),
                    3 => out.copy_from_slice(&$imp::<3>(w, a, stride)),
                    4 => out.copy_from_slice(&$imp::<4>(w, a, stride)),
                    n => panic!("{n} rows: the row kernels take 1 to {}", crate::kernels::MAX_ROWS),
                }
            }
        }
    };
}

pub mod scalar;
#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
#[cfg(target_arch = "aarch64")]
mod neon;

/// Instruction-set level of a kernel table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Isa {
    Scalar,
    /// AVX2 + FMA + F16C.
    Avx2,
    /// AVX-512 F/BW/VL/DQ/VNNI/VBMI/BITALG + GFNI (plus the AVX2 set): Ice Lake / Zen 4 and later.
    /// CPUs with AVX-512 but without VBMI/GFNI (Skylake-X, Cascade Lake) use the AVX2 table.
    Avx512,
    /// NEON + dotprod (aarch64): Apple M1 and later, Neoverse N1 / V1 / V2 (Grace, Graviton 2+).
    /// aarch64 CPUs without dotprod (Cortex-A72 and older) use the scalar table.
    Neon,
}

impl Isa {
    /// Whether this machine can run kernels of this level.
    pub fn available(self) -> bool {
        match self {
            Isa::Scalar => true,
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => {
                is_x86_feature_detected!("avx2")
                    && is_x86_feature_detected!("fma")
                    && is_x86_feature_detected!("f16c")
            }
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => {
                Isa::Avx2.available()
                    && is_x86_feature_detected!("avx512f")
                    && is_x86_feature_detected!("avx512bw")
                    && is_x86_feature_detected!("avx512vl")
                    && is_x86_feature_detected!("avx512dq")
                    && is_x86_feature_detected!("avx512vnni")
                    && is_x86_feature_detected!("avx512vbmi")
                    && is_x86_feature_detected!("gfni")
                    && is_x86_feature_detected!("avx512bitalg")
            }
            #[cfg(target_arch = "aarch64")]
            Isa::Neon => std::arch::is_aarch64_feature_detected!("dotprod"),
            #[allow(unreachable_patterns)]
            _ => false,
        }
    }
    pub fn all() -> [Isa; 4] {
        [Isa::Scalar, Isa::Avx2, Isa::Avx512, Isa::Neon]
    }
    /// The SIMD levels of this machine's architecture (whether or not this CPU has them).
    pub fn simd_of_arch() -> &'static [Isa] {
        if cfg!(target_arch = "x86_64") {
            &[Isa::Avx2, Isa::Avx512]
        } else if cfg!(target_arch = "aarch64") {
            &[Isa::Neon]
        } else {
            &[]
        }
    }
}

/// Best ISA level of this machine (detected once). `DS4_QUANT_ISA=scalar|avx2` caps it.
pub fn detect_isa() -> Isa {
    static ISA: OnceLock<Isa> = OnceLock::new();
    *ISA.get_or_init(|| {
        let best = [Isa::Avx512, Isa::Avx2, Isa::Neon].into_iter().find(|i| i.available()).unwrap_or(Isa::Scalar);
        match std::env::var("DS4_QUANT_ISA").ok().as_deref() {
            Some("scalar") => Isa::Scalar,
            Some("avx2") if Isa::Avx2.available() => Isa::Avx2,
            _ => best,
        }
    })
}

pub type DotQ = fn(&[u8], &[u8]) -> f32;
pub type DotF = fn(&[u8], &[f32]) -> f32;
/// One weight row against `out.len()` (1 to 4) activation rows at `a[0..]`, `a[stride..]`,
/// `a[2 * stride..]`, ...: the weight blocks are unpacked once for all of them. Row t's result equals
/// the same table's one-row kernel on that row bit for bit (same operations in the same order).
pub type DotRows = fn(w: &[u8], a: &[u8], stride: usize, out: &mut [f32]);
/// Most activation rows a `DotRows` kernel takes at once.
pub const MAX_ROWS: usize = 4;

/// One ISA's set of dot-product kernels. Quantized kernels take (weight row bytes, activation
/// row bytes); the activation is Q8_0 for Q8_0 weights and Q8_K for Q2_K/Q4_K/IQ2_XXS.
pub struct Kernels {
    pub isa: Isa,
    pub q8_0: DotQ,
    pub q2_k: DotQ,
    pub q4_k: DotQ,
    pub iq2_xxs: DotQ,
    pub f32: DotF,
    pub f16: DotF,
    pub bf16: DotF,
    /// Several-row forms (prefill, batches, MTP verify rows), where the table has them.
    pub q8_0_rows: Option<DotRows>,
    pub q2_k_rows: Option<DotRows>,
    pub q4_k_rows: Option<DotRows>,
    pub iq2_xxs_rows: Option<DotRows>,
}

static SCALAR: Kernels = Kernels {
    isa: Isa::Scalar,
    q8_0: scalar::dot_q8_0_q8_0,
    q2_k: scalar::dot_q2_k_q8_k,
    q4_k: scalar::dot_q4_k_q8_k,
    iq2_xxs: scalar::dot_iq2_xxs_q8_k,
    f32: scalar::dot_f32,
    f16: scalar::dot_f16,
    bf16: scalar::dot_bf16,
    q8_0_rows: None,
    q2_k_rows: None,
    q4_k_rows: None,
    iq2_xxs_rows: None,
};

#[cfg(target_arch = "x86_64")]
static AVX2: Kernels = Kernels {
    isa: Isa::Avx2,
    q8_0: avx2::dot_q8_0_q8_0,
    q2_k: avx2::dot_q2_k_q8_k,
    q4_k: avx2::dot_q4_k_q8_k,
    iq2_xxs: avx2::dot_iq2_xxs_q8_k,
    f32: avx2::dot_f32,
    f16: avx2::dot_f16,
    bf16: avx2::dot_bf16,
    q8_0_rows: Some(avx2::rows_q8_0_q8_0),
    q2_k_rows: Some(avx2::rows_q2_k_q8_k),
    q4_k_rows: Some(avx2::rows_q4_k_q8_k),
    iq2_xxs_rows: Some(avx2::rows_iq2_xxs_q8_k),
};

#[cfg(target_arch = "aarch64")]
static NEON: Kernels = Kernels {
    isa: Isa::Neon,
    q8_0: neon::dot_q8_0_q8_0,
    q2_k: neon::dot_q2_k_q8_k,
    q4_k: neon::dot_q4_k_q8_k,
    iq2_xxs: neon::dot_iq2_xxs_q8_k,
    f32: neon::dot_f32,
    f16: neon::dot_f16,
    bf16: neon::dot_bf16,
    q8_0_rows: Some(neon::rows_q8_0_q8_0),
    q2_k_rows: Some(neon::rows_q2_k_q8_k),
    q4_k_rows: Some(neon::rows_q4_k_q8_k),
    iq2_xxs_rows: Some(neon::rows_iq2_xxs_q8_k),
};

#[cfg(target_arch = "x86_64")]
static AVX512: Kernels = Kernels {
    isa: Isa::Avx512,
    q8_0: avx512::dot_q8_0_q8_0,
    q2_k: avx512::dot_q2_k_q8_k,
    q4_k: avx512::dot_q4_k_q8_k,
    iq2_xxs: avx512::dot_iq2_xxs_q8_k,
    f32: avx512::dot_f32,
    f16: avx512::dot_f16,
    bf16: avx512::dot_bf16,
    q8_0_rows: None,
    q2_k_rows: None,
    q4_k_rows: None,
    iq2_xxs_rows: None,
};

impl Kernels {
    /// The kernel table of `isa`, or None when this machine lacks it.
    pub fn for_isa(isa: Isa) -> Option<&'static Kernels> {
        if !isa.available() {
            return None;
        }
        match isa {
            Isa::Scalar => Some(&SCALAR),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => Some(&AVX2),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => Some(&AVX512),
            #[cfg(target_arch = "aarch64")]
            Isa::Neon => Some(&NEON),
            #[allow(unreachable_patterns)]
            _ => None,
        }
    }
    /// The table of `detect_isa()`.
    pub fn best() -> &'static Kernels {
        Kernels::for_isa(detect_isa()).unwrap_or(&SCALAR)
    }
}

/// Asserts that N activation rows of `blocks` blocks of `bytes`, `stride` apart, fit in `a` (the
/// N-row kernels then reach their blocks through `act_blocks` without further checks).
#[allow(dead_code)]
#[inline(always)]
pub(crate) fn check_rows<const N: usize>(a: &[u8], stride: usize, blocks: usize, bytes: usize) {
    assert!(N == 0 || a.len() >= (N - 1) * stride + blocks * bytes, "activation rows shorter than the weight row");
}

/// The N activation blocks of block `b` (rows `stride` apart), unchecked: the kernel called
/// `check_rows` with the same stride and at least (b + 1) * bytes bytes of blocks per row.
#[allow(dead_code)]
#[inline(always)]
pub(crate) fn act_blocks<const N: usize>(a: &[u8], stride: usize, b: usize, bytes: usize) -> [&[u8]; N] {
    let mut ba: [&[u8]; N] = [&[]; N];
    for (t, r) in ba.iter_mut().enumerate() {
        let o = t * stride + b * bytes;
        debug_assert!(o + bytes <= a.len());
        // SAFETY: o + bytes <= (N - 1) * stride + blocks * bytes <= a.len() (check_rows).
        *r = unsafe { a.get_unchecked(o..o + bytes) };
    }
    ba
}

/// IQ2_XXS kernel of `k`'s ISA that takes its Q8_K activation in the row-transposed layout
/// of [`q8k_to_row_major_groups`], if that ISA has one (internal fast path of `matvec`).
pub(crate) fn iq2_xxs_transposed(k: &Kernels) -> Option<DotQ> {
    match k.isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => Some(avx512::dot_iq2_xxs_q8_kt),
        _ => None,
    }
}

/// Reorders the 256 quants of every Q8_K block in `a` from element order (group g = 32
/// elements, row l = 8 elements: position 32g + 8l + j) to row-major-by-chunk order
/// (position 64l + 8g + j), and pre-multiplies the block scale by IQ2_XXS's 1/8 (exact: a
/// power of two). Bsums are kept.
pub(crate) fn q8k_to_row_major_groups(a: &mut [u8]) {
    for b in a.chunks_exact_mut(crate::blocks::Q8_K_BYTES) {
        let d = crate::blocks::f32_at(b, 0) * 0.125;
        b[0..4].copy_from_slice(&d.to_le_bytes());
        let qs: [u8; crate::blocks::QK_K] = b[4..4 + crate::blocks::QK_K].try_into().unwrap();
        for g in 0..8 {
            for l in 0..4 {
                let src = 32 * g + 8 * l;
                let dst = 4 + 64 * l + 8 * g;
                b[dst..dst + 8].copy_from_slice(&qs[src..src + 8]);
            }
        }
    }
}

/// How far ahead (bytes) the quantized SIMD kernels prefetch their weight stream: per block
/// they hint the lines `PF` bytes past it. Rows are contiguous in a matrix, so near a row's
/// end this pulls in the next rows. 2 KiB measured best on the 2-core dev VM (see
/// bench/results/README.md); `DS4_QUANT_PF=<bytes>` overrides it, 0 turns it off.
#[cfg(target_arch = "x86_64")]
pub(crate) fn kpf() -> usize {
    static D: OnceLock<usize> = OnceLock::new();
    *D.get_or_init(|| std::env::var("DS4_QUANT_PF").ok().and_then(|v| v.parse().ok()).unwrap_or(2048))
}

/// Prefetch hint for the line at `p + off` (may lie past the slice: a hint never faults).
/// Only the x86-64 SIMD kernels use it.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) fn pf_at(p: &[u8], off: usize) {
    // SAFETY: prefetch is only a hint; it never faults, whatever the address.
    unsafe {
        core::arch::x86_64::_mm_prefetch::<{ core::arch::x86_64::_MM_HINT_T0 }>(p.as_ptr().wrapping_add(off).cast())
    }
}

const fn make_sign_masks() -> [u64; 128] {
    let ks = crate::iq2xxs_tables::KSIGNS_IQ2XS_CONST;
    let mut out = [0u64; 128];
    let mut i = 0;
    while i < 128 {
        let mut v = 0u64;
        let mut j = 0;
        while j < 8 {
            let b: u64 = if ks[i] & (1 << j) != 0 { 0xFF } else { 0x01 };
            v |= b << (8 * j);
            j += 1;
        }
        out[i] = v;
        i += 1;
    }
    out
}

/// Per sign index: 8 bytes of +1 (0x01) or −1 (0xFF), for `_mm256_sign_epi8`.
#[allow(dead_code)]
pub(crate) static IQ2_SIGN_MASKS: [u64; 128] = make_sign_masks();

#[cfg(test)]
mod tests {
    use super::*;
    use crate::random::SplitMix64;
    use crate::{dequantize, quantize_row_q8_k, random_valid_blocks, GgmlType};

    /// The transposed-activation IQ2_XXS kernel agrees with the scalar reference on the
    /// natural layout (same bound as tests/kernels.rs), odd block counts included.
    #[test]
    fn iq2_xxs_transposed_matches_scalar() {
        let mut tested = 0;
        for isa in Isa::all() {
            let Some(k) = Kernels::for_isa(isa) else { continue };
            let Some(dot_t) = iq2_xxs_transposed(k) else { continue };
            tested += 1;
            for nb in [1usize, 3, 5, 7, 13, 16] {
                for seed in 0..4u64 {
                    let cols = 256 * nb;
                    let w = random_valid_blocks(GgmlType::IQ2_XXS, seed * 97 + nb as u64, nb);
                    let mut r = SplitMix64(seed + 5000);
                    let x: Vec<f32> = (0..cols).map(|_| r.normal()).collect();
                    let mut a = vec![0u8; nb * crate::blocks::Q8_K_BYTES];
                    quantize_row_q8_k(&x, &mut a);
                    let want = scalar::dot_iq2_xxs_q8_k(&w, &a);
                    let mut at = a.clone();
                    q8k_to_row_major_groups(&mut at);
                    let got = dot_t(&w, &at);
                    let mut wd = vec![0f32; cols];
                    let mut ad = vec![0f32; cols];
                    dequantize(GgmlType::IQ2_XXS, &w, &mut wd).unwrap();
                    dequantize(GgmlType::Q8_K, &a, &mut ad).unwrap();
                    let mag: f64 = wd.iter().zip(&ad).map(|(&p, &q)| (p as f64 * q as f64).abs()).sum();
                    assert!(((got - want) as f64).abs() <= 1e-5 * mag + 1e-9, "{isa:?} nb={nb} seed={seed}: {got} vs {want}");
                }
            }
        }
        // Only AVX-512 has a transposed kernel.
        if std::env::var("DS4_REQUIRE_SIMD").is_ok() && cfg!(target_arch = "x86_64") {
            assert!(tested > 0, "no transposed IQ2_XXS kernel tested");
        }
    }

    #[test]
    fn row_major_groups_is_a_permutation() {
        let mut a = vec![0u8; 2 * crate::blocks::Q8_K_BYTES];
        for (i, v) in a.iter_mut().enumerate() {
            *v = i as u8;
        }
        for b in 0..2 {
            a[b * crate::blocks::Q8_K_BYTES..][..4].copy_from_slice(&(1.5f32 + b as f32).to_le_bytes());
        }
        let orig = a.clone();
        q8k_to_row_major_groups(&mut a);
        for b in 0..2 {
            let o = b * crate::blocks::Q8_K_BYTES;
            let d = crate::blocks::f32_at(&orig, o);
            assert_eq!(crate::blocks::f32_at(&a, o), d * 0.125);
            assert_eq!(a[o + 260..o + 292], orig[o + 260..o + 292]);
            for g in 0..8 {
                for l in 0..4 {
                    for j in 0..8 {
                        assert_eq!(a[o + 4 + 64 * l + 8 * g + j], orig[o + 4 + 32 * g + 8 * l + j]);
                    }
                }
            }
        }
    }
}
