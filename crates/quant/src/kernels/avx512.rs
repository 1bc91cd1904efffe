//! AVX-512 (F/BW/VL/DQ/VNNI) kernels. Types without a dedicated 512-bit kernel yet use AVX2.
#![cfg(target_arch = "x86_64")]

pub(crate) use super::avx2::{dot_bf16, dot_f16, dot_f32, dot_iq2_xxs_q8_k, dot_q2_k_q8_k, dot_q4_k_q8_k, dot_q8_0_q8_0};
