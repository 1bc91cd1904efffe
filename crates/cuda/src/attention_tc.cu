
// ---------------------------------------------------------------------------------------------
// Prefill attention on tensor cores (mma.sync m16n8k16: f16 operands, f32 accumulation) for head
// dimension 512, the prefill counterpart of attn_impl (same candidates, sink and inverse rope).
// Block = (token i, group of 16*HT heads), 8 warps. Warp w owns head tile ht = w % HT (16 heads) and
// output dims [dh*DW, dh*DW + DW) with dh = w / HT. The heads share one KV row per candidate (MQA), so
// a chunk of 32 candidate rows is converted to f16 in shared memory once and serves every head of the
// block, as K for the scores and as V for the weighted sum. The softmax is online: the running max
// starts at the head's sink (running sum 1), and each chunk rescales the accumulators, whose rows a
// lane knows from the mma layout (g = lane / 4 and g + 8).
// ---------------------------------------------------------------------------------------------
#define TC_D 512
#define TC_LD 520  // f16 row stride in shared memory: 16 bytes of padding keep fragment loads conflict-free
#define TC_CH 32   // candidates per chunk
#define TC_SLD 36  // f32 score row stride

template <int HT>
__device__ void attn_tc_impl(const float* __restrict__ q, const float* __restrict__ kvb, const float* __restrict__ ring, const float* __restrict__ comp,
                             const int* __restrict__ sel, const float* __restrict__ sinks, float* __restrict__ o, int nh, long long pos0, int swa,
                             int ratio, int topk, const double* __restrict__ freqs, int half) {
    constexpr int NH = 16 * HT;       // heads per block
    constexpr int WPT = 8 / HT;       // warps per head tile
    constexpr int DW = TC_D / WPT;    // output dims per warp
    constexpr int NT = DW / 8;        // n8 output tiles per warp
    constexpr int CW = TC_CH / WPT;   // candidates per warp in the score step
    constexpr int ST = CW / 8;        // n8 score tiles per warp
    extern __shared__ __align__(16) u8 smb[];
    u16* qs = (u16*)smb;                       // NH rows x TC_LD
    u16* ks = qs + NH * TC_LD;                 // TC_CH rows x TC_LD
    float* ss = (float*)(ks + TC_CH * TC_LD);  // NH rows x TC_SLD
    int i = blockIdx.x, h0 = blockIdx.y * NH;
    int tid = threadIdx.x, lane = tid & 31, w = tid >> 5;
    int ht = w % HT, dh = w / HT, g = lane >> 2, t = lane & 3;
    long long pos = pos0 + i;
    long long lo = pos + 1 - swa;
    if (lo < 0) lo = 0;
    int nraw = (int)(pos - lo + 1);
    int nc = ratio ? (int)((pos + 1) / ratio) : 0;
    bool use_sel = sel && nc > topk;
    int ncand = nraw + (use_sel ? topk : nc);
    for (int u = tid; u < NH * TC_D / 4; u += blockDim.x) {
        int r = u / (TC_D / 4), k = (u % (TC_D / 4)) * 4;
        float4 v = *(const float4*)(q + ((u64)i * nh + h0 + r) * TC_D + k);
        *(uint2*)(qs + r * TC_LD + k) = make_uint2(pack2h(v.x, v.y), pack2h(v.z, v.w));
    }
    float acc[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; nt++) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.0f;
    int hr = h0 + ht * 16 + g;  // this lane's rows: heads hr and hr + 8
    float m0 = sinks[hr], m1 = sinks[hr + 8], l0 = 1.0f, l1 = 1.0f;
    float scale = 1.0f / sqrtf((float)TC_D);
    for (int c0 = 0; c0 < ncand; c0 += TC_CH) {
        __syncthreads();  // the previous chunk's rows and scores are no longer read
        for (int u = tid; u < TC_CH * TC_D / 4; u += blockDim.x) {
            int r = u / (TC_D / 4), k = (u % (TC_D / 4)) * 4, c = c0 + r;
            float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
            if (c < ncand) {
                const float* row;
                if (c < nraw) {
                    long long p = lo + c;
                    row = p >= pos0 ? kvb + (u64)(p - pos0) * TC_D : ring + (u64)(p % swa) * TC_D;
                } else {
                    int rr = c - nraw;
                    if (use_sel) rr = sel[(u64)i * topk + rr];
                    row = comp + (u64)rr * TC_D;
                }
                v = *(const float4*)(row + k);
            }
            *(uint2*)(ks + r * TC_LD + k) = make_uint2(pack2h(v.x, v.y), pack2h(v.z, v.w));
        }
        __syncthreads();
        // Scores: 16 heads x CW candidates per warp.
        {
            float sc[ST][4];
#pragma unroll
            for (int s = 0; s < ST; s++) sc[s][0] = sc[s][1] = sc[s][2] = sc[s][3] = 0.0f;
            const u16* qa = qs + (ht * 16 + g) * TC_LD + 2 * t;
#pragma unroll 4
            for (int k0 = 0; k0 < TC_D; k0 += 16) {
                u32 a0 = *(const u32*)(qa + k0), a1 = *(const u32*)(qa + 8 * TC_LD + k0);
                u32 a2 = *(const u32*)(qa + k0 + 8), a3 = *(const u32*)(qa + 8 * TC_LD + k0 + 8);
#pragma unroll
                for (int s = 0; s < ST; s++) {
                    const u16* kb = ks + (dh * CW + s * 8 + g) * TC_LD + k0 + 2 * t;
                    mma16816(sc[s], a0, a1, a2, a3, *(const u32*)kb, *(const u32*)(kb + 8));
                }
            }
#pragma unroll
            for (int s = 0; s < ST; s++) {
                float* sr = ss + (ht * 16 + g) * TC_SLD + dh * CW + s * 8 + 2 * t;
                *(float2*)sr = make_float2(sc[s][0], sc[s][1]);
                *(float2*)(sr + 8 * TC_SLD) = make_float2(sc[s][2], sc[s][3]);
            }
        }
        __syncthreads();
        // Online softmax over the chunk for rows g and g+8 of the head tile; this lane keeps the
        // columns its P fragments need: e = kk*4 + j*2 + b is column kk*16 + j*8 + 2t + b.
        float p0[8], p1[8];
        const float* r0 = ss + (ht * 16 + g) * TC_SLD;
        const float* r1 = r0 + 8 * TC_SLD;
        float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
        for (int e = 0; e < 8; e++) {
            int col = (e >> 2) * 16 + ((e >> 1) & 1) * 8 + 2 * t + (e & 1);
            bool ok = c0 + col < ncand;
            p0[e] = ok ? r0[col] * scale : -INFINITY;
            p1[e] = ok ? r1[col] * scale : -INFINITY;
            mx0 = fmaxf(mx0, p0[e]);
            mx1 = fmaxf(mx1, p1[e]);
        }
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
        float mn0 = fmaxf(m0, mx0), mn1 = fmaxf(m1, mx1);
        float al0 = expf(m0 - mn0), al1 = expf(m1 - mn1);
        float s0 = 0.0f, s1 = 0.0f;
#pragma unroll
        for (int e = 0; e < 8; e++) {
            p0[e] = expf(p0[e] - mn0);
            p1[e] = expf(p1[e] - mn1);
            s0 += p0[e];
            s1 += p1[e];
        }
        s0 += __shfl_xor_sync(0xffffffffu, s0, 1);
        s0 += __shfl_xor_sync(0xffffffffu, s0, 2);
        s1 += __shfl_xor_sync(0xffffffffu, s1, 1);
        s1 += __shfl_xor_sync(0xffffffffu, s1, 2);
        l0 = l0 * al0 + s0;
        l1 = l1 * al1 + s1;
        m0 = mn0;
        m1 = mn1;
#pragma unroll
        for (int nt = 0; nt < NT; nt++) {
            acc[nt][0] *= al0;
            acc[nt][1] *= al0;
            acc[nt][2] *= al1;
            acc[nt][3] *= al1;
        }
        // Weighted sum: the chunk's rows are V (candidates x dims); two k16 steps of 16 candidates.
        int mi = lane >> 3, rr = lane & 7;
#pragma unroll
        for (int kk = 0; kk < 2; kk++) {
            u32 a0 = pack2h(p0[kk * 4], p0[kk * 4 + 1]), a1 = pack2h(p1[kk * 4], p1[kk * 4 + 1]);
            u32 a2 = pack2h(p0[kk * 4 + 2], p0[kk * 4 + 3]), a3 = pack2h(p1[kk * 4 + 2], p1[kk * 4 + 3]);
            const u16* vrow = ks + (kk * 16 + rr + 8 * (mi & 1)) * TC_LD + dh * DW + 8 * (mi >> 1);
#pragma unroll
            for (int np = 0; np < NT / 2; np++) {
                u32 b0, b1, b2, b3;
                ldsm_x4_t(b0, b1, b2, b3, vrow + np * 16);
                mma16816(acc[2 * np], a0, a1, a2, a3, b0, b1);
                mma16816(acc[2 * np + 1], a0, a1, a2, a3, b2, b3);
            }
        }
    }
    // Normalise, inverse rope on the tail (a lane holds whole pairs: dims j, j+1 with j even), store.
    float inv0 = 1.0f / l0, inv1 = 1.0f / l1;
    int tail0 = TC_D - 2 * half;
    float* o0 = o + ((u64)i * nh + hr) * TC_D;
    float* o1 = o0 + 8 * TC_D;
#pragma unroll
    for (int nt = 0; nt < NT; nt++) {
        int j = dh * DW + nt * 8 + 2 * t;
        float x0 = acc[nt][0] * inv0, x1 = acc[nt][1] * inv0, y0 = acc[nt][2] * inv1, y1 = acc[nt][3] * inv1;
        if (j >= tail0) {
            double s, cth;
            sincos((double)pos * freqs[(j - tail0) >> 1], &s, &cth);
            float sf = -(float)s, cf = (float)cth;
            float a = x0 * cf - x1 * sf, b = x0 * sf + x1 * cf;
            x0 = a;
            x1 = b;
            a = y0 * cf - y1 * sf;
            b = y0 * sf + y1 * cf;
            y0 = a;
            y1 = b;
        }
        *(float2*)(o0 + j) = make_float2(x0, x1);
        *(float2*)(o1 + j) = make_float2(y0, y1);
    }
}
#define ATTN_TC_ARGS const float* q, const float* kvb, const float* ring, const float* comp, const int* sel, const float* sinks, float* o, int nh, \
    long long pos0, int swa, int ratio, int topk, const double* freqs, int half
#define ATTN_TC_CALL q, kvb, ring, comp, sel, sinks, o, nh, pos0, swa, ratio, topk, freqs, half
extern "C" __global__ void __launch_bounds__(256, 1) attn_tc64(ATTN_TC_ARGS) { PDL_ENTRY attn_tc_impl<4>(ATTN_TC_CALL); }
extern "C" __global__ void __launch_bounds__(256, 2) attn_tc32(ATTN_TC_ARGS) { PDL_ENTRY attn_tc_impl<2>(ATTN_TC_CALL); }
