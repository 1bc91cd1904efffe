
// ---------------------------------------------------------------------------------------------
// Indexer scores on tensor cores for prefill batches (f16 operands, f32 accumulation), 64 heads of
// 128 dims: scores[i][c] = sum_h w[i][h] * relu(q[i][h] . k[c]). Block = (64 candidate rows, token
// i), 4 warps; warp w computes heads 16w..16w+15 against the 64 rows (mma m16n8k16), applies relu and
// the head weights, and sums its heads (lanes of one column, then the four warps).
// ---------------------------------------------------------------------------------------------
#define IX_LD 136  // f16 row stride (272 bytes: conflict-free fragment loads)

extern "C" __global__ void __launch_bounds__(128) idx_scores_tc(const float* __restrict__ q, const float* __restrict__ wts, const float* __restrict__ keys,
                                                                float* __restrict__ scores, int ldsc, long long pos0, int ratio, int topk) { PDL_ENTRY
    __shared__ __align__(16) u16 qs[64 * IX_LD];
    __shared__ __align__(16) u16 ks[64 * IX_LD];
    __shared__ float part[4][64];
    int i = blockIdx.y;
    long long pos = pos0 + i;
    int nc = (int)((pos + 1) / ratio);
    if (nc <= topk) return;
    int r0 = blockIdx.x * 64;
    if (r0 >= nc) return;
    int tid = threadIdx.x, lane = tid & 31, w = tid >> 5, g = lane >> 2, t = lane & 3;
    for (int u = tid; u < 64 * 32; u += blockDim.x) {
        int r = u >> 5, k = (u & 31) * 4;
        float4 a = *(const float4*)(q + ((u64)i * 64 + r) * 128 + k);
        *(uint2*)(qs + r * IX_LD + k) = make_uint2(pack2h(a.x, a.y), pack2h(a.z, a.w));
        int rr = r0 + r;
        float4 b = rr < nc ? *(const float4*)(keys + (u64)rr * 128 + k) : make_float4(0.f, 0.f, 0.f, 0.f);
        *(uint2*)(ks + r * IX_LD + k) = make_uint2(pack2h(b.x, b.y), pack2h(b.z, b.w));
    }
    __syncthreads();
    float sc[8][4];
#pragma unroll
    for (int nt = 0; nt < 8; nt++) sc[nt][0] = sc[nt][1] = sc[nt][2] = sc[nt][3] = 0.0f;
    const u16* qa = qs + (w * 16 + g) * IX_LD + 2 * t;
#pragma unroll
    for (int k0 = 0; k0 < 128; k0 += 16) {
        u32 a0 = *(const u32*)(qa + k0), a1 = *(const u32*)(qa + 8 * IX_LD + k0);
        u32 a2 = *(const u32*)(qa + k0 + 8), a3 = *(const u32*)(qa + 8 * IX_LD + k0 + 8);
#pragma unroll
        for (int nt = 0; nt < 8; nt++) {
            const u16* kb = ks + (nt * 8 + g) * IX_LD + k0 + 2 * t;
            mma16816(sc[nt], a0, a1, a2, a3, *(const u32*)kb, *(const u32*)(kb + 8));
        }
    }
    float w0 = wts[(u64)i * 64 + w * 16 + g], w1 = wts[(u64)i * 64 + w * 16 + g + 8];
#pragma unroll
    for (int nt = 0; nt < 8; nt++) {
        float s0 = fmaxf(sc[nt][0], 0.0f) * w0 + fmaxf(sc[nt][2], 0.0f) * w1;
        float s1 = fmaxf(sc[nt][1], 0.0f) * w0 + fmaxf(sc[nt][3], 0.0f) * w1;
#pragma unroll
        for (int o = 4; o < 32; o <<= 1) {
            s0 += __shfl_xor_sync(0xffffffffu, s0, o);
            s1 += __shfl_xor_sync(0xffffffffu, s1, o);
        }
        if (g == 0) {
            part[w][nt * 8 + 2 * t] = s0;
            part[w][nt * 8 + 2 * t + 1] = s1;
        }
    }
    __syncthreads();
    if (tid < 64 && r0 + tid < nc) scores[(u64)i * ldsc + r0 + tid] = part[0][tid] + part[1][tid] + part[2][tid] + part[3][tid];
}
