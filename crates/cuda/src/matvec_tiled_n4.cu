
// Tiled mat-vecs (matvec_tiled.cuh), four tokens per pass: batches below the cuBLAS threshold.
MV4_KERNEL(mv4_f16, WK_F16, 4, 1, 2)
MV4_KERNEL(mv4_q8s, WK_Q8S, 4, 1, 2)
MV4_KERNEL(mv4_q2_k, WK_Q2K, 4, 1, 2)
MV4_KERNEL(mv4_q4_k, WK_Q4K, 4, 1, 2)
MV4_IQ2(4, 1, 2)
