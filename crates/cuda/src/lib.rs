//! CUDA backend of DwarfStar (design §2): resident weights, NVRTC-compiled kernels, cuBLAS GEMMs for
//! prefill. Without the `cuda` feature only the kernel source is exposed (so the default build needs no
//! CUDA); with it, [`CudaStage`] runs a stage's forward pass on the GPU with the CPU `Stage`'s signature.

/// CUDA C source of every kernel (compiled at start-up by NVRTC for the device's architecture).
pub const KERNELS_CU: &str = concat!(include_str!("kernels.cu"), include_str!("attention_tc.cu"), include_str!("compressor_chunk.cu"), include_str!("moe_gemm.cu"), include_str!("attention_dec.cu"), include_str!("indexer_tc.cu"), include_str!("matvec_q8.cu"), include_str!("hc_decode.cu"), include_str!("matvec_q80.cu"));

/// Kernels looked up by name after loading the module.
pub const KERNEL_NAMES: &[&str] = &[
    "mv_q8_0_n1", "mv_q8_0_n4", "mv_q2_k_n1", "mv_q2_k_n4", "mv_q4_k_n1", "mv_q4_k_n4", "mv_iq2_xxs_n1", "mv_iq2_xxs_n4",
    "mv_f16_n1", "mv_f16_n4", "mv_bf16_n1", "mv_bf16_n4", "mv_f32_n1", "mv_f32_n4", "dq_q8_0", "dq_q2_k", "dq_q4_k",
    "dq_iq2_xxs", "dq_bf16", "dq_f32", "f32_to_f16", "embed", "rms_rows", "norm_rope_qat", "hc_post",
    "head_collapse", "attn_h1", "attn_h4", "attn_h16", "ring_store", "comp_seq", "comp_reset", "idx_scores", "idx_topk",
    "route", "swiglu", "moe_count", "moe_scatter", "gather_rows", "scale_inplace", "argmax_row",
    "mv4_f16_n1", "mv4_f16_n4", "mv4_q8s_n1", "mv4_q8s_n4", "mv4_q2_k_n1", "mv4_q2_k_n4", "mv4_q4_k_n1", "mv4_q4_k_n4", "mv4_iq2s_n1",
    "mv4_iq2s_n4", "split_rows", "dq_q8s", "dq_iq2s", "attn_dec", "attn_dec_w", "attn_dec_merge", "read_sum", "hc_pre_norm", "mvq_iq2s_n1", "hc_comb", "mvq_q2_k_n1",
    "attn_tc64", "attn_tc32", "comp_pool", "comp_state", "f32_to_f16_v4", "moe_gemm", "idx_scores_tc",
    "q8k_quant", "mvq8_iq2s_n1", "mvq8_q2_k_n1", "moe_gemm_iq2s", "moe_gemm_q2k", "q80_quant", "mvq8_q8s_n1", "hc_pre_dec", "moe_combine_post", "gate_route_dec", "hc_entry_dec", "mvq8_iq2s_n1_v1", "mvq8_q2_k_n1_v1",
    "mvq8_q8p_r4", "mvq8_q8p_r2", "mvq8_q8p_r1", "mvq8_q8p_r4f", "mvq8_q8p_r2f", "mvq8_q8p_r1f", "mvq8_q2_k_n1x",
];

/// Host address ranges registered when the GPU reads the weights in place.
pub mod host_ranges;
/// The device KV state in the host `KvState` format (disk KV cache on CUDA).
pub mod kv_layout;

#[cfg(feature = "cuda")]
pub mod gpu;
#[cfg(feature = "cuda")]
mod host_pin;
#[cfg(feature = "cuda")]
pub use host_pin::{integrated, WeightPlace};
#[cfg(feature = "cuda")]
mod matvec;
#[cfg(feature = "cuda")]
mod probe;
#[cfg(feature = "cuda")]
mod probe_fused;
#[cfg(feature = "cuda")]
mod stage;
#[cfg(feature = "cuda")]
pub use probe::{act_copy_checks, router_check, CopyCheck, attention_paths, bench_gemm, bench_matvec, bench_read, indexer_paths, matmul_paths, matvec_fast_paths, bench_matvec_fast, grouped_gemm_paths, AttnCase, decode_attention_path, DecodeAttnOut, greedy_row};
#[cfg(feature = "cuda")]
pub use probe_fused::fused_input_checks;
#[cfg(feature = "cuda")]
pub use stage::{CudaStage, CudaStats, GpuPlan};
#[cfg(feature = "cuda")]
mod dec_attn;
