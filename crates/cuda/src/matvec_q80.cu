
// The persistent Q8_0 mat-vecs (matvec_q80.cuh) on an int8 row from q80_quant.
extern "C" __global__ void __launch_bounds__(256, 2) mvq8_q8p_r4(Q8P_ARGS) { mvq8_q8p<4>(Q8P_CALL); }
extern "C" __global__ void __launch_bounds__(256, 2) mvq8_q8p_r2(Q8P_ARGS) { mvq8_q8p<2>(Q8P_CALL); }
extern "C" __global__ void __launch_bounds__(256, 2) mvq8_q8p_r1(Q8P_ARGS) { mvq8_q8p<1>(Q8P_CALL); }
// Several activation rows through one matrix (matvec_q80.cuh): the weights of a step loaded once.
extern "C" __global__ void __launch_bounds__(256, 2) mvq8_q8m_r2(Q8M_ARGS) { mvq8_q8m<2>(Q8M_CALL); }
