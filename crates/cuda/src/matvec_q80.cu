
// The persistent Q8_0 mat-vecs (matvec_q80.cuh) on an int8 row from q80_quant.
extern "C" __global__ void __launch_bounds__(256, 2) mvq8_q8p_r4(Q8P_ARGS) { mvq8_q8p<4, false>(Q8P_CALL, Q8P_NOPRO); }
extern "C" __global__ void __launch_bounds__(256, 2) mvq8_q8p_r2(Q8P_ARGS) { mvq8_q8p<2, false>(Q8P_CALL, Q8P_NOPRO); }
extern "C" __global__ void __launch_bounds__(256, 2) mvq8_q8p_r1(Q8P_ARGS) { mvq8_q8p<1, false>(Q8P_CALL, Q8P_NOPRO); }
// f32 input X (one row shared by every slot) with the prologue of Q8pPro; XQ / XD unused.
