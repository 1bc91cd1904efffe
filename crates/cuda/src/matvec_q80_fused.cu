
// The persistent Q8_0 mat-vecs (matvec_q80.cuh) that quantize their f32 input themselves (after an
// optional RMS norm or SwiGLU), for products whose input no kernel quantized.
#define Q8PF_ARGS Q8P_ARGS, const float* __restrict__ X, const float* __restrict__ X2, const float* __restrict__ NW, float fa
extern "C" __global__ void __launch_bounds__(256, 2) mvq8_q8p_r4f(Q8PF_ARGS) { mvq8_q8p<4, true>(Q8P_CALL, Q8pPro{X, X2, NW, fa}); }
extern "C" __global__ void __launch_bounds__(256, 2) mvq8_q8p_r2f(Q8PF_ARGS) { mvq8_q8p<2, true>(Q8P_CALL, Q8pPro{X, X2, NW, fa}); }
extern "C" __global__ void __launch_bounds__(256, 2) mvq8_q8p_r1f(Q8PF_ARGS) { mvq8_q8p<1, true>(Q8P_CALL, Q8pPro{X, X2, NW, fa}); }
