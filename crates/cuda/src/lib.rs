//! CUDA backend of DwarfStar (design §2): resident weights, NVRTC-compiled kernels, cuBLAS GEMMs for
//! prefill. Without the `cuda` feature only the kernel source is exposed (so the default build needs no
//! CUDA); with it, [`CudaStage`] runs a stage's forward pass on the GPU with the CPU `Stage`'s signature.

/// One NVRTC program: the shared device helpers (`common.cuh`, plus `matvec.cuh` for the mat-vecs)
/// and one file of kernels. Modules compile in parallel at start-up and are cached one file each, so
/// the first run on a machine waits for the slowest module, not for the sum of them.
pub struct KernelModule {
    /// Stable name (cache file names, messages).
    pub name: &'static str,
    /// The CUDA C source NVRTC compiles.
    pub src: &'static str,
    /// The kernels this module defines (looked up by name after loading).
    pub kernels: &'static [&'static str],
}

macro_rules! module {
    ($name:literal, [$($hdr:literal),*], $file:literal, [$($k:literal),* $(,)?]) => {
        KernelModule { name: $name, src: concat!(include_str!("common.cuh"), $(include_str!($hdr),)* include_str!($file)), kernels: &[$($k),*] }
    };
}

/// Every kernel module (each kernel name appears in exactly one), slowest to compile first: they are
/// compiled in this order, so the long ones start at once (CPU seconds for sm_90a, measured with
/// `tests/nvrtc_compile.rs` `compile_times`: 1.4 for the first, 0.02 for the last, ~12 in all).
pub const MODULES: &[KernelModule] = &[
    module!("matvec_tiled_n4", ["matvec.cuh", "matvec_tiled.cuh"], "matvec_tiled_n4.cu", ["mv4_f16_n4", "mv4_q8s_n4", "mv4_q2_k_n4", "mv4_q4_k_n4", "mv4_iq2s_n4"]),
    module!("matvec_tiled_n8", ["matvec.cuh", "matvec_tiled.cuh"], "matvec_tiled_n8.cu", ["mv4_f16_n8", "mv4_q8s_n8", "mv4_q2_k_n8", "mv4_q4_k_n8", "mv4_iq2s_n8"]),
    module!("matvec_tiled_n1", ["matvec.cuh", "matvec_tiled.cuh"], "matvec_tiled_n1.cu", ["mv4_f16_n1", "mv4_q8s_n1", "mv4_q2_k_n1", "mv4_q4_k_n1", "mv4_iq2s_n1"]),
    module!("attention", [], "attention.cu", ["attn_h1", "attn_h4", "attn_h16", "ring_store"]),
    module!("attention_tc", ["tensor_core.cuh"], "attention_tc.cu", ["attn_tc64", "attn_tc32"]),
    module!("hc_entry_decode", [], "hc_entry_decode.cu", ["hc_entry_dec"]),
    module!("attention_dec", ["tensor_core.cuh"], "attention_dec.cu", ["attn_dec", "attn_dec_w", "attn_dec_merge"]),
    module!("matvec", ["matvec.cuh"], "matvec.cu", [
        "mv_q8_0_n1", "mv_q8_0_n4", "mv_q2_k_n1", "mv_q2_k_n4", "mv_q4_k_n1", "mv_q4_k_n4", "mv_iq2_xxs_n1", "mv_iq2_xxs_n4",
        "mv_f16_n1", "mv_f16_n4", "mv_bf16_n1", "mv_bf16_n4", "mv_f32_n1", "mv_f32_n4",
    ]),
    module!("matvec_q8", ["matvec.cuh"], "matvec_q8.cu", ["q8k_quant", "mvq8_iq2s_n1", "mvq8_q2_k_n1", "q80_quant", "mvq8_q8s_n1"]),
    module!("matvec_q80", ["matvec.cuh", "matvec_q80.cuh"], "matvec_q80.cu", ["mvq8_q8p_r4", "mvq8_q8p_r2", "mvq8_q8p_r1", "mvq8_q8m_r2"]),
    module!("hc", ["hc.cuh"], "hc.cu", ["hc_post", "head_collapse", "hc_pre_norm", "hc_comb", "hc_comb_rows"]),
    module!("matvec_2bit", ["matvec.cuh"], "matvec_2bit.cu", ["mvq_iq2s_n1", "mvq_q2_k_n1"]),
    module!("moe", ["routing.cuh"], "moe.cu", ["route", "swiglu", "moe_count", "moe_scatter", "gather_rows", "scale_inplace", "moe_combine_post", "gate_route_dec"]),
    module!("moe_gemm", ["tensor_core.cuh"], "moe_gemm.cu", ["moe_gemm", "moe_gemm_iq2s", "moe_gemm_q2k", "moe_gemm_t128", "moe_gemm_iq2s_t128", "moe_gemm_q2k_t128"]),
    module!("embed_norm_rope", [], "embed_norm_rope.cu", ["embed", "rms_rows", "norm_rope_qat"]),
    module!("compressor_chunk", [], "compressor_chunk.cu", ["comp_pool", "comp_state"]),
    module!("indexer", [], "indexer.cu", ["idx_scores", "idx_topk"]),
    module!("argmax", [], "argmax.cu", ["argmax_row"]),
    module!("dequant", [], "dequant.cu", ["dq_q8_0", "dq_q2_k", "dq_q4_k", "dq_iq2_xxs", "dq_bf16", "dq_f32", "f32_to_f16", "f32_to_f16_v4"]),
    module!("compressor", [], "compressor.cu", ["comp_seq", "comp_reset"]),
    module!("undo", [], "undo.cu", ["copy_jobs"]),
    module!("indexer_tc", ["tensor_core.cuh"], "indexer_tc.cu", ["idx_scores_tc"]),
    module!("split_layout", [], "split_layout.cu", ["split_rows", "dq_q8s", "dq_iq2s"]),
    module!("read_bandwidth", [], "read_bandwidth.cu", ["read_sum"]),
];

/// Host address ranges registered when the GPU reads the weights in place.
pub mod host_ranges;
/// The device KV state in the host `KvState` format (disk KV cache on CUDA).
pub mod kv_layout;

/// The on-disk cache of compiled kernel modules.
pub mod kernel_cache;

#[cfg(feature = "cuda")]
pub mod gpu;
#[cfg(feature = "cuda")]
pub mod nvrtc;
#[cfg(feature = "cuda")]
mod host_pin;
#[cfg(feature = "cuda")]
mod staging;
#[cfg(feature = "cuda")]
pub use host_pin::{integrated, WeightPlace};
#[cfg(feature = "cuda")]
mod matvec;
#[cfg(feature = "cuda")]
mod probe;
#[cfg(feature = "cuda")]
mod stage;
#[cfg(feature = "cuda")]
pub use probe::{act_copy_checks, router_check, CopyCheck, attention_paths, bench_gemm, bench_matvec, bench_read, indexer_paths, matmul_paths, staging_round_trips, matvec_fast_paths, shared_rows_q8_0_paths, bench_matvec_fast, grouped_gemm_paths, AttnCase, decode_attention_path, DecodeAttnOut, greedy_row};
#[cfg(feature = "cuda")]
pub use stage::{CudaMtp, CudaMtpOps, CudaStage, CudaStats, GpuPlan, CUDA_MTP_STEP_PAIRS, EXACT_BATCH_ROWS};
#[cfg(feature = "cuda")]
mod dec_attn;

#[cfg(test)]
mod module_list_tests {
    use super::MODULES;

    /// Every kernel a module's source declares by name (not through a macro) is listed for that
    /// module, so the launchers find it; no name is listed twice. (The NVRTC test checks that every
    /// listed name, macro-made ones included, is in the compiled module.)
    #[test]
    fn declared_kernels_are_listed_once() {
        let mut all = std::collections::HashSet::new();
        for m in MODULES {
            for k in m.kernels {
                assert!(all.insert(*k), "kernel {k} listed twice");
            }
            for decl in m.src.split("extern \"C\" __global__ void").skip(1) {
                // "__launch_bounds__(..) name(" or " name(": the identifier after the bounds.
                let rest = decl.trim_start();
                let rest = if let Some(r) = rest.strip_prefix("__launch_bounds__(") { &r[r.find(')').map_or(0, |i| i + 1)..] } else { rest };
                let rest = rest.trim_start();
                let name: String = rest.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
                // Names made by a macro (NAME, NAME##_n##NT) are left to the NVRTC test.
                if name.is_empty() || rest[name.len()..].starts_with('#') || !name.chars().any(|c| c.is_ascii_lowercase()) {
                    continue;
                }
                assert!(m.kernels.contains(&name.as_str()), "kernel {name} declared in module {} but not listed", m.name);
            }
        }
    }
}
