
// Tiled mat-vecs (matvec_tiled.cuh), eight tokens per pass: the rows of a batched decode step (one
// per session), so each weight byte is read once for up to eight sessions. Each token's sums are
// those of the four-token kernels (same chunk order, U = 1).
MV4_KERNEL(mv4_f16, WK_F16, 8, 1, 1)
MV4_KERNEL(mv4_q8s, WK_Q8S, 8, 1, 1)
MV4_KERNEL(mv4_q2_k, WK_Q2K, 8, 1, 1)
MV4_KERNEL(mv4_q4_k, WK_Q4K, 8, 1, 1)
MV4_IQ2(8, 1, 1)
