
// ---------------------------------------------------------------------------------------------
// Grouped expert GEMM for prefill, one launch per matrix kind over every expert's tokens (a cuBLAS
// call per expert costs more host time than its ~100-token product takes on the GPU). Tile b covers
// tokens rows tiles[b].y .. + tiles[b].z (< 64) of the gathered activations X (f16, ld K) against
// weight slot tiles[b].x (R x K, slots ws bytes apart), rows blockIdx.y * 128 .. + 128:
// Y[row0 + t][r] = sum_k X[row0 + t][k] * W[r][k] (f32, ld R). mma.sync m16n8k16 (f16, f32
// accumulation); tiles of BT = 64 tokens (8 warps as 2 (32 tokens) x 4 (32 rows)) or 128 (4 x 2 (64
// rows): an expert's weights decoded once for up to 128 tokens); K in steps of 32, double-buffered.
// Every output sums its products in the same order for either BT (bit-identical).
// Weights are f16 (cp.async), or IQ2_XXS (split layout) / Q2_K read as stored: the next step's raw
// words are loaded into registers before this step's MMAs and decoded to f16 in shared memory after
// them, with the formulas of dq_iq2s / dq_q2_k (the same f16 values as dequantizing first).
// ---------------------------------------------------------------------------------------------
#define MG_BR 128
#define MG_BK 32
#define MG_LD 40  // f16 row stride in shared memory (80 bytes: conflict-free fragment loads)

#define MG_F16 0
#define MG_IQ2S 1
#define MG_Q2K 2

template <int WT, int BT> __device__ __forceinline__ void moe_gemm_impl(const u8* __restrict__ W, u64 ws, const int4* __restrict__ tiles, const u16* __restrict__ X,
                                                                       float* __restrict__ Y, int K, int R, int n) {
    constexpr int WTN = BT / 32, RW = MG_BR * WTN / 8, NT = RW / 8;  // token warps, rows a warp, its 8-row tiles
    __shared__ __align__(16) u16 xs[2][BT * MG_LD];
    __shared__ __align__(16) u16 wsh[2][MG_BR * MG_LD];
    // Without a tile list: one dense product over n tokens (slot 0, tiles of 64 tokens in order).
    int4 tl = tiles ? tiles[blockIdx.x] : make_int4(0, blockIdx.x * BT, min(BT, n - (int)blockIdx.x * BT), 0);
    int nb = K >> 8;
    u64 rb = WT == MG_F16 ? (u64)K * 2 : WT == MG_IQ2S ? (u64)nb * 66 : (u64)nb * 84;
    const u8* Wb = W + (u64)tl.x * ws + (u64)blockIdx.y * MG_BR * rb;
    const u16* Xb = X + (u64)tl.y * K;
    int m = tl.z;
    int tid = threadIdx.x, lane = tid & 31, w = tid >> 5;
    int wt = w % WTN, wr = w / WTN, g = lane >> 2, t = lane & 3;
    // X tile: BT rows x 64 bytes = BT * 4 chunks of 16 bytes (BT / 64 per thread); W tile: 512 chunks
    // of 8 values (two per thread: row u / 4, columns 8 (u % 4) ..).
    auto load_x = [&](int st, int k0) {
#pragma unroll
        for (int q = 0; q < BT / 64; q++) {
            int u = tid + 256 * q, r = u >> 2, c = (u & 3) * 8;
            bool ok = r < m;
            cp_async16(&xs[st][r * MG_LD + c], ok ? Xb + (u64)r * K + k0 + c : Xb, ok ? 16 : 0);
        }
        if (WT == MG_F16) {
#pragma unroll
            for (int q = 0; q < 2; q++) {
                int u = tid + q * 256;
                int rw = u >> 2, cw = (u & 3) * 8;
                cp_async16(&wsh[st][rw * MG_LD + cw], Wb + (u64)rw * rb + 2 * (k0 + cw), 16);
            }
        }
        asm volatile("cp.async.commit_group;\n");
    };
    uint4 raw[2];
    auto fetch_w = [&](int k0) {
        int c = k0 >> 8, q8 = (k0 >> 5) & 7;
#pragma unroll
        for (int q = 0; q < 2; q++) {
            int u = tid + q * 256;
            const u8* wr = Wb + (u64)(u >> 2) * rb;
            if (WT == MG_IQ2S) {
                const u8* p = wr + 64 * c + 8 * q8;
                raw[q] = make_uint4(*(const u32*)p, *(const u32*)(p + 4), ld16(wr + nb * 64 + 2 * c), 0);
            } else if (WT == MG_Q2K) {
                const u8* b = wr + (u64)c * 84;
                int h = q8 >> 2, s = q8 & 3, l8 = u & 3;
                raw[q] = make_uint4(*(const u32*)(b + 16 + 32 * h + 8 * l8), *(const u32*)(b + 20 + 32 * h + 8 * l8), b[8 * h + 2 * s + (l8 >> 1)], *(const u32*)(b + 80));
            }
        }
    };
    auto store_w = [&](int st, int k0) {
#pragma unroll
        for (int q = 0; q < 2; q++) {
            int u = tid + q * 256;
            int rw = u >> 2, l = u & 3;
            u32 o[4];
            if (WT == MG_IQ2S) {
                u32 a0 = raw[q].x, a1 = raw[q].y;
                float db = h2f((u16)raw[q].z) * (0.5f + (float)(a1 >> 28)) * 0.25f;
                u64 gv = iq2xxs_grid[(a0 >> (8 * l)) & 255];
                u32 sg = ksign((a1 >> (7 * l)) & 127);
#pragma unroll
                for (int k = 0; k < 8; k += 2) {
                    float v0 = db * (float)((gv >> (8 * k)) & 255), v1 = db * (float)((gv >> (8 * k + 8)) & 255);
                    if ((sg >> k) & 1) v0 = -v0;
                    if ((sg >> (k + 1)) & 1) v1 = -v1;
                    o[k / 2] = (u32)f2h(v0) | ((u32)f2h(v1) << 16);
                }
            } else if (WT == MG_Q2K) {
                int s = (k0 >> 5) & 3;
                u32 sc = raw[q].z, dd = raw[q].w;
                float dl = h2f(dd & 0xffff) * (float)(sc & 15), ml = h2f(dd >> 16) * (float)(sc >> 4);
#pragma unroll
                for (int k = 0; k < 8; k += 2) {
                    u32 wv = k < 4 ? raw[q].x : raw[q].y;
                    int b0 = 8 * (k & 3);
                    float v0 = (float)((wv >> (b0 + 2 * s)) & 3), v1 = (float)((wv >> (b0 + 8 + 2 * s)) & 3);
                    o[k / 2] = (u32)f2h(dl * v0 - ml) | ((u32)f2h(dl * v1 - ml) << 16);
                }
            }
            *(uint4*)&wsh[st][rw * MG_LD + 8 * l] = make_uint4(o[0], o[1], o[2], o[3]);
        }
    };
    float acc[2][NT][4];
#pragma unroll
    for (int a = 0; a < 2; a++)
#pragma unroll
        for (int b = 0; b < NT; b++) acc[a][b][0] = acc[a][b][1] = acc[a][b][2] = acc[a][b][3] = 0.0f;
    int nk = K / MG_BK;
    load_x(0, 0);
    if (WT != MG_F16) {
        fetch_w(0);
        store_w(0, 0);
    }
    for (int kt = 0; kt < nk; kt++) {
        bool next = kt + 1 < nk;
        if (next) {
            load_x((kt + 1) & 1, (kt + 1) * MG_BK);
            if (WT != MG_F16) fetch_w((kt + 1) * MG_BK);
            asm volatile("cp.async.wait_group 1;\n");
        } else {
            asm volatile("cp.async.wait_group 0;\n");
        }
        __syncthreads();
        const u16* xa = xs[kt & 1];
        const u16* wb = wsh[kt & 1];
#pragma unroll
        for (int kk = 0; kk < MG_BK; kk += 16) {
            u32 a[2][4], b[NT][2];
#pragma unroll
            for (int mt = 0; mt < 2; mt++) {
                const u16* p = xa + (wt * 32 + mt * 16 + g) * MG_LD + kk + 2 * t;
                a[mt][0] = *(const u32*)p;
                a[mt][1] = *(const u32*)(p + 8 * MG_LD);
                a[mt][2] = *(const u32*)(p + 8);
                a[mt][3] = *(const u32*)(p + 8 * MG_LD + 8);
            }
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
                const u16* p = wb + (wr * RW + nt * 8 + g) * MG_LD + kk + 2 * t;
                b[nt][0] = *(const u32*)p;
                b[nt][1] = *(const u32*)(p + 8);
            }
#pragma unroll
            for (int mt = 0; mt < 2; mt++)
#pragma unroll
                for (int nt = 0; nt < NT; nt++) mma16816(acc[mt][nt], a[mt][0], a[mt][1], a[mt][2], a[mt][3], b[nt][0], b[nt][1]);
        }
        // The other buffer was last read before the previous step's closing barrier.
        if (WT != MG_F16 && next) store_w((kt + 1) & 1, (kt + 1) * MG_BK);
        __syncthreads();
    }
    // c0, c1: token g, rows 2t, 2t+1; c2, c3: token g + 8.
#pragma unroll
    for (int mt = 0; mt < 2; mt++)
#pragma unroll
        for (int nt = 0; nt < NT; nt++) {
            int tok = wt * 32 + mt * 16 + g;
            int row = blockIdx.y * MG_BR + wr * RW + nt * 8 + 2 * t;
            if (tok < m) *(float2*)(Y + (u64)(tl.y + tok) * R + row) = make_float2(acc[mt][nt][0], acc[mt][nt][1]);
            if (tok + 8 < m) *(float2*)(Y + (u64)(tl.y + tok + 8) * R + row) = make_float2(acc[mt][nt][2], acc[mt][nt][3]);
        }
}

#define MOE_GEMM(NAME, WT, BT) \
    extern "C" __global__ void __launch_bounds__(256) NAME(const u8* __restrict__ W, u64 ws, const int4* __restrict__ tiles, const u16* __restrict__ X, \
                                                           float* __restrict__ Y, int K, int R, int n) { PDL_ENTRY moe_gemm_impl<WT, BT>(W, ws, tiles, X, Y, K, R, n); }
MOE_GEMM(moe_gemm, MG_F16, 64)
MOE_GEMM(moe_gemm_iq2s, MG_IQ2S, 64)
MOE_GEMM(moe_gemm_q2k, MG_Q2K, 64)
MOE_GEMM(moe_gemm_t128, MG_F16, 128)
MOE_GEMM(moe_gemm_iq2s_t128, MG_IQ2S, 128)
MOE_GEMM(moe_gemm_q2k_t128, MG_Q2K, 128)
