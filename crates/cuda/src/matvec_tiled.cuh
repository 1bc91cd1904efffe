// ---------------------------------------------------------------------------------------------
// Row-tiled mat-vec ("mv4"): one warp computes R = 4 rows, so each activation load feeds four rows
// (for 2-bit weights the f32 activations are 12-16x the weight bytes; without the reuse the L1, not
// HBM, would be the limit). The row is walked in chunks of 256 values; in a chunk lane l owns
// positions 4l..4l+3 and 128+4l..128+4l+3, so activation float4 loads are contiguous across lanes.
// `ks` warps split a row group over K (reduced in shared memory) when there are few rows.
// Q8_0 and IQ2_XXS rows use the split layout written by `split_rows` at load (block payloads first,
// then the f16 block scales), which makes every payload load 4-byte aligned.
// ---------------------------------------------------------------------------------------------
#define WK_F16 0
#define WK_Q8S 1
#define WK_Q2K 2
#define WK_Q4K 3
#define WK_IQ2S 4

template <int K> __device__ __forceinline__ u64 wk_row_bytes(int cols) {
    if (K == WK_F16) return (u64)cols * 2;
    if (K == WK_Q8S) return (u64)(cols >> 5) * 34;
    if (K == WK_Q2K) return (u64)(cols >> 8) * 84;
    if (K == WK_Q4K) return (u64)(cols >> 8) * 144;
    return (u64)(cols >> 8) * 66;
}


// x·w over the 4 weights at positions j..j+3 (j = chunk*256 + 4*lane + 128*half) of row `wr`.
// `xs4` = x.x+x.y+x.z+x.w (for the k-quant minimums). G: guard positions past `cols` (F16/Q8 tails).
template <int K, bool G>
__device__ __forceinline__ float wk_dot(const u8* __restrict__ wr, int cols, int c, int lane, int half, const u64* grid, float4 x, float xs4) {
    int j = c * 256 + 4 * lane + 128 * half;
    if (G && j >= cols) return 0.0f;
    if (K == WK_F16) {
        uint2 a = *(const uint2*)(wr + 2 * (u64)j);
        return h2f(a.x & 0xffff) * x.x + h2f(a.x >> 16) * x.y + h2f(a.y & 0xffff) * x.z + h2f(a.y >> 16) * x.w;
    } else if (K == WK_Q8S) {
        u32 q = *(const u32*)(wr + j) ^ 0x80808080u;  // signed -> biased unsigned bytes
        float d = h2f(ld16(wr + cols + 2 * (j >> 5)));
        float s = (byte_f(q, 0) - 128.0f) * x.x + (byte_f(q, 1) - 128.0f) * x.y + (byte_f(q, 2) - 128.0f) * x.z + (byte_f(q, 3) - 128.0f) * x.w;
        return d * s;
    } else if (K == WK_Q2K) {
        const u8* b = wr + (u64)c * 84;
        u32 q = (*(const u32*)(b + 16 + 32 * half + 4 * (lane & 7)) >> (2 * (lane >> 3))) & 0x03030303u;
        int sc = b[8 * half + (lane >> 2)];
        float d = h2f(ld16(b + 80)), dmin = h2f(ld16(b + 82));
        float s = byte_f(q, 0) * x.x + byte_f(q, 1) * x.y + byte_f(q, 2) * x.z + byte_f(q, 3) * x.w;
        return d * byte_f((u32)sc & 15u, 0) * s - dmin * byte_f((u32)sc >> 4, 0) * xs4;
    } else if (K == WK_Q4K) {
        const u8* b = wr + (u64)c * 144;
        int sub = 4 * half + (lane >> 3), pair = 2 * half + (lane >> 4), hi = (lane >> 3) & 1;
        u32 q = (*(const u32*)(b + 16 + 32 * pair + 4 * (lane & 7)) >> (4 * hi)) & 0x0F0F0F0Fu;
        float d = h2f(ld16(b)), dmin = h2f(ld16(b + 2));
        int sc, mn;
        q4k_sm(sub, b + 4, &sc, &mn);
        float s = byte_f(q, 0) * x.x + byte_f(q, 1) * x.y + byte_f(q, 2) * x.z + byte_f(q, 3) * x.w;
        return d * byte_f((u32)sc, 0) * s - dmin * byte_f((u32)mn, 0) * xs4;
    } else {
        int nb = cols >> 8;
        int g = 4 * half + (lane >> 3), kk = (lane & 7) >> 1, m0 = 4 * (lane & 1);
        const u8* qs = wr + (u64)c * 64 + 8 * g;
        u32 a0 = *(const u32*)qs, a1 = *(const u32*)(qs + 4);
        float d = h2f(ld16(wr + (u64)nb * 64 + 2 * c));
        float db = d * (0.5f + byte_f(a1 >> 28, 0)) * 0.25f;
        u64 gv = grid[(a0 >> (8 * kk)) & 255];
        u32 g4 = (u32)(gv >> (8 * m0));                       // the 4 grid bytes of this lane
        u32 sg = ksign((a1 >> (7 * kk)) & 127) >> m0;         // their 4 sign bits
        float4 xx = x;
        xx.x = __uint_as_float(__float_as_uint(xx.x) ^ ((sg & 1u) << 31));
        xx.y = __uint_as_float(__float_as_uint(xx.y) ^ (((sg >> 1) & 1u) << 31));
        xx.z = __uint_as_float(__float_as_uint(xx.z) ^ (((sg >> 2) & 1u) << 31));
        xx.w = __uint_as_float(__float_as_uint(xx.w) ^ (((sg >> 3) & 1u) << 31));
        float s = byte_f(g4, 0) * xx.x + byte_f(g4, 1) * xx.y + byte_f(g4, 2) * xx.z + byte_f(g4, 3) * xx.w;
        return db * s;
    }
}

// U chunks (c, c+ks, ..., c+(U-1)*ks) of R rows for NT tokens, in one basic block so that every
// weight and activation load of the U chunks is issued before the first use (bytes in flight per
// warp, not instruction count, bound a mat-vec on HBM).
template <int K, int NT, int U, bool G>
__device__ __forceinline__ void mv4_chunks(const u8* const* wr, const float* xs, int ldx, int nt, int cols, int c, int ks, int lane, const u64* grid, float (*acc)[NT]) {
    constexpr int R = 4;
    float4 xa[U][NT], xb[U][NT];
#pragma unroll
    for (int u = 0; u < U; u++) {
        int j = (c + u * ks) * 256 + 4 * lane;
#pragma unroll
        for (int t = 0; t < NT; t++) {
            const float* xt = xs + (u64)min(t, nt - 1) * ldx;
            xa[u][t] = (!G || j < cols) ? __ldg((const float4*)(xt + j)) : make_float4(0.f, 0.f, 0.f, 0.f);
            xb[u][t] = (!G || j + 128 < cols) ? __ldg((const float4*)(xt + j + 128)) : make_float4(0.f, 0.f, 0.f, 0.f);
        }
    }
#pragma unroll
    for (int u = 0; u < U; u++)
#pragma unroll
        for (int r = 0; r < R; r++)
#pragma unroll
            for (int t = 0; t < NT; t++) {
                float sa = xa[u][t].x + xa[u][t].y + xa[u][t].z + xa[u][t].w, sb = xb[u][t].x + xb[u][t].y + xb[u][t].z + xb[u][t].w;
                acc[r][t] += wk_dot<K, G>(wr[r], cols, c + u * ks, lane, 0, grid, xa[u][t], sa) + wk_dot<K, G>(wr[r], cols, c + u * ks, lane, 1, grid, xb[u][t], sb);
            }
}

template <int K, int NT, int U> __device__ __forceinline__ void mv4_impl(MV_ARGS, const u64* grid) {
    constexpr int R = 4;
    __shared__ float red[8][R][NT];
    int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, part = wid % ks;
    int r0 = (blockIdx.x * (8 / ks) + wid / ks) * R;
    int z = blockIdx.z;
    int mat = eids ? eids[z] : z;
    int t0 = blockIdx.y * NT, nt = min(NT, n - t0);
    const u8* wm = W + (u64)mat * w_mat_bytes;
    u64 rb = wk_row_bytes<K>(cols);
    const float* xs = X + (u64)z * x_z + (u64)t0 * ldx;
    const u8* wr[R];
#pragma unroll
    for (int r = 0; r < R; r++) wr[r] = wm + (u64)min(r0 + r, rows - 1) * rb;
    float acc[R][NT];
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int t = 0; t < NT; t++) acc[r][t] = 0.0f;
    int nfull = cols >> 8;
    int c = part;
    for (; c + (U - 1) * ks < nfull; c += U * ks) mv4_chunks<K, NT, U, false>(wr, xs, ldx, nt, cols, c, ks, lane, grid, acc);
    for (; c < nfull; c += ks) mv4_chunks<K, NT, 1, false>(wr, xs, ldx, nt, cols, c, ks, lane, grid, acc);
    if ((cols & 255) && nfull % ks == part) mv4_chunks<K, NT, 1, true>(wr, xs, ldx, nt, cols, nfull, ks, lane, grid, acc);
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int t = 0; t < NT; t++) {
            float s = warp_sum(acc[r][t]);
            if (lane == 0) red[wid][r][t] = s;
        }
    __syncthreads();
    if (part == 0 && lane < R * NT) {
        int r = lane / NT, t = lane % NT;
        if (r0 + r < rows && t < nt) {
            float s = 0.0f;
            for (int p = 0; p < ks; p++) s += red[wid + p][r][t];
            Y[(u64)z * y_z + (u64)(t0 + t) * ldy + r0 + r] = s;
        }
    }
}

#define MV4_KERNEL(NAME, K, NT, U, MINB) \
    extern "C" __global__ void __launch_bounds__(256, MINB) NAME##_n##NT(MV_ARGS) { PDL_ENTRY mv4_impl<K, NT, U>(MV_CALL, nullptr); }
#define MV4_IQ2(NT, U, MINB) \
    extern "C" __global__ void __launch_bounds__(256, MINB) mv4_iq2s_n##NT(MV_ARGS) { PDL_ENTRY \
        __shared__ u64 grid[256]; \
        grid[threadIdx.x] = iq2xxs_grid[threadIdx.x]; \
        __syncthreads(); \
        mv4_impl<WK_IQ2S, NT, U>(MV_CALL, grid); \
    }
