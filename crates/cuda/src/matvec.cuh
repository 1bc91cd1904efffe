// ---------------------------------------------------------------------------------------------
// Quantized mat-vec: one warp per output row, NT tokens per pass (weights read once per pass).
// Grid: x = row blocks (8 rows per 256-thread block), y = token groups of NT, z = matrix slot.
// Slot z selects matrix (eids ? eids[z] : z) of a stack (w_mat_bytes apart), input x + z*x_z and
// output y + z*y_z: used for routed experts (decode) and the grouped output projection.
// ---------------------------------------------------------------------------------------------
#define MV_ARGS const u8* __restrict__ W, u64 w_mat_bytes, const int* __restrict__ eids, \
    const float* __restrict__ X, int ldx, int x_z, float* __restrict__ Y, int ldy, int y_z, int rows, int cols, int n, int ks

// ks warps share a row (split over K, reduced through shared memory): few-row matrices get enough warps.
#define MV_PROLOGUE(ROWBYTES) \
    __shared__ float mv_red[8][NT]; \
    int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, part = wid % ks; \
    int row = blockIdx.x * ((blockDim.x >> 5) / ks) + wid / ks; \
    int z = blockIdx.z; \
    int mat = eids ? eids[z] : z; \
    int t0 = blockIdx.y * NT; \
    bool live = row < rows; \
    if (!live) row = rows - 1; \
    const u8* wr = W + (u64)mat * w_mat_bytes + (u64)row * (ROWBYTES); \
    const float* xs = X + (u64)z * x_z + (u64)t0 * ldx; \
    int nt = min(NT, n - t0); \
    float acc[NT]; \
    _Pragma("unroll") for (int t = 0; t < NT; t++) acc[t] = 0.0f;

#define MV_EPILOGUE \
    _Pragma("unroll") for (int t = 0; t < NT; t++) { \
        float s = warp_sum(acc[t]); \
        if (lane == 0) mv_red[wid][t] = s; \
    } \
    __syncthreads(); \
    if (part == 0 && live && lane < nt) { \
        float s = 0.0f; \
        for (int p = 0; p < ks; p++) s += mv_red[wid + p][lane]; \
        Y[(u64)z * y_z + (u64)(t0 + lane) * ldy + row] = s; \
    }


#define MV_CALL W, w_mat_bytes, eids, X, ldx, x_z, Y, ldy, y_z, rows, cols, n, ks

// Bytes of `v` (selected by `sel`, 0..3 each nibble) to exact floats: PRMT builds 2^23 + byte and one
// FADD removes the 2^23 (two full-rate instructions instead of a quarter-rate I2F).
__device__ __forceinline__ float byte_f(u32 v, u32 k) { return __uint_as_float(__byte_perm(v, 0x4B000000u, 0x7540u | k)) - 8388608.0f; }


// Shared by the f32-activation "mvq" kernels (matvec_2bit.cu) and the int8-activation ones: R rows per warp.
#define MVQ_R 8
// Row results of an mvq kernel: warp sums, then the ks warps sharing a row group add their parts
// (in part order) and lane r writes row r0 + r.
__device__ __forceinline__ void mvq_store(const float* acc, float (*red)[MVQ_R], int lane, int wid, int part, int ks, int r0, int rows, float* y) {
#pragma unroll
    for (int r = 0; r < MVQ_R; r++) {
        float v = warp_sum(acc[r]);
        if (lane == 0) red[wid][r] = v;
    }
    __syncthreads();
    if (part == 0 && lane < MVQ_R && r0 + lane < rows) {
        float v = 0.0f;
        for (int p = 0; p < ks; p++) v += red[wid + p][lane];
        y[r0 + lane] = v;
    }
}

// The IQ2_XXS words of step `st` for rows r0.. (split layout): the lane's 32-value group (8 bytes)
// and its superblock's f16 scale, per row (rows past the end repeat the last one).
__device__ __forceinline__ void iq2s_fetch(const u8* wm, u64 rb, int nb, int ng, int r0, int rows, int st, int lane, uint2* a, u16* dh) {
    int G = min(st * 32 + lane, ng - 1), c = G >> 3, g = G & 7;
#pragma unroll
    for (int r = 0; r < MVQ_R; r++) {
        const u8* wr = wm + (u64)min(r0 + r, rows - 1) * rb;
        a[r] = *(const uint2*)(wr + 64 * c + 8 * g);
        dh[r] = ld16(wr + nb * 64 + 2 * c);
    }
}

// The Q2_K words of superblock `c` for rows r0.. and lane (half h, byte quad t): 4 quant bytes, the
// half's 8 scale bytes, d and dmin (rows past the end repeat the last one).
__device__ __forceinline__ void q2k_fetch(const u8* wm, u64 rb, int nb, int r0, int rows, int c, int h, int t, u32* q, u32* s0, u32* s1, u32* dd) {
#pragma unroll
    for (int r = 0; r < MVQ_R; r++) {
        const u8* b = wm + (u64)min(r0 + r, rows - 1) * rb + (u64)c * 84;
        q[r] = *(const u32*)(b + 16 + 32 * h + 4 * t);
        s0[r] = *(const u32*)(b + 8 * h);
        s1[r] = *(const u32*)(b + 8 * h + 4);
        dd[r] = *(const u32*)(b + 80);
    }
}

__device__ __forceinline__ float sgnx(float x, u32 sg, int k) { return __uint_as_float(__float_as_uint(x) ^ ((sg >> k) << 31)); }
