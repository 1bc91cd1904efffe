
// Tiled mat-vecs (matvec_tiled.cuh), one token per pass: decode, and products the int8 kernels do not take.
MV4_KERNEL(mv4_f16, WK_F16, 1, 4, 2)
MV4_KERNEL(mv4_q8s, WK_Q8S, 1, 4, 2)
MV4_KERNEL(mv4_q2_k, WK_Q2K, 1, 4, 2)
MV4_KERNEL(mv4_q4_k, WK_Q4K, 1, 4, 2)
MV4_IQ2(1, 4, 2)
