
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

// A small unsigned int (< 2^23) as float without a conversion instruction (1/8 rate on Hopper):
// 2^23 + v has v as its mantissa, and the subtraction is exact.
__device__ __forceinline__ float q2_float(u32 v) { return __uint_as_float(0x4B000000u | v) - 8388608.0f; }

// Byte permute (PTX prmt: the selector's nibbles are used as they are; ours stay below 8).
__device__ __forceinline__ u32 prmt(u32 a, u32 b, u32 sel) {
    u32 r;
    asm("prmt.b32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(sel));
    return r;
}

template <int WT, int BT> __device__ __forceinline__ void moe_gemm_impl(const u8* __restrict__ W, u64 ws, const int4* __restrict__ tiles, const u16* __restrict__ X,
                                                                       float* __restrict__ Y, int K, int R, int n) {
    constexpr int WTN = BT / 32, RW = MG_BR * WTN / 8, NT = RW / 8;  // token warps, rows a warp, its 8-row tiles
    __shared__ __align__(16) u16 xs[2][BT * MG_LD];
    __shared__ __align__(16) u16 wsh[2][MG_BR * MG_LD];
    __shared__ u64 gsel[WT == MG_IQ2S ? 256 : 1];
    // Without a tile list: one dense product over n tokens (slot 0, tiles of 64 tokens in order).
    int4 tl = tiles ? tiles[blockIdx.x] : make_int4(0, blockIdx.x * BT, min(BT, n - (int)blockIdx.x * BT), 0);
    int nb = K >> 8;
    u64 rb = WT == MG_F16 ? (u64)K * 2 : WT == MG_IQ2S ? (u64)nb * 66 : (u64)nb * 84;
    const u8* Wb = W + (u64)tl.x * ws + (u64)blockIdx.y * MG_BR * rb;
    const u16* Xb = X + (u64)tl.y * K;
    int m = tl.z;
    int tid = threadIdx.x, lane = tid & 31, w = tid >> 5;
    int wt = w % WTN, wr = w / WTN, g = lane >> 2, t = lane & 3;
    int mts = (m - wt * 32 + 15) >> 4;  // this warp's 16-token sub-tiles holding tokens (<= 0: none)
    // X tile: BT rows x 64 bytes = BT * 4 chunks of 16 bytes (BT / 64 per thread); W tile: 512 chunks
    // of 8 values (two per thread: row u / 4, columns 8 (u % 4) ..).
    // Per-thread sources, computed once (the loop only adds the step's offset): X rows (zero-filled
    // past the tile's m tokens) and the two weight rows this thread loads.
    const u16* xsrc[BT / 64];
    int xdst[BT / 64], xbytes[BT / 64];
#pragma unroll
    for (int q = 0; q < BT / 64; q++) {
        int u = tid + 256 * q, r = u >> 2, c = (u & 3) * 8;
        xbytes[q] = r < m ? 16 : 0;
        xsrc[q] = r < m ? Xb + (u64)r * K + c : Xb;
        xdst[q] = r * MG_LD + c;
    }
    const u8* wrow[2] = {Wb + (u64)(tid >> 2) * rb, Wb + (u64)((tid + 256) >> 2) * rb};
    auto load_x = [&](int st, int k0) {
#pragma unroll
        for (int q = 0; q < BT / 64; q++) cp_async16(&xs[st][xdst[q]], xbytes[q] ? xsrc[q] + k0 : Xb, xbytes[q]);
        if (WT == MG_F16) {
#pragma unroll
            for (int q = 0; q < 2; q++) cp_async16(&wsh[st][((tid + q * 256) >> 2) * MG_LD + (tid & 3) * 8], wrow[q] + 2 * (k0 + (tid & 3) * 8), 16);
        }
        asm volatile("cp.async.commit_group;\n");
    };
    uint4 raw[2];
    auto fetch_w = [&](int k0) {
        int c = k0 >> 8, q8 = (k0 >> 5) & 7;
#pragma unroll
        for (int q = 0; q < 2; q++) {
            const u8* wr = wrow[q];
            if (WT == MG_IQ2S) {
                const u8* p = wr + (k0 >> 2);  // 64 c + 8 q8
                raw[q] = make_uint4(*(const u32*)p, *(const u32*)(p + 4), ld16(wr + nb * 64 + 2 * c), 0);
            } else if (WT == MG_Q2K) {
                const u8* b = wr + c * 84;
                int h = q8 >> 2, s = q8 & 3, l8 = tid & 3;
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
                u64 sv = gsel[(a0 >> (8 * l)) & 255];
                u32 sg = ksign((a1 >> (7 * l)) & 127);
                // The 8 values take 3 magnitudes (db times 8, 25, 43), each rounded to f16 once; a byte
                // permute of that palette by the grid entry's selectors gives a pair of magnitudes, and
                // the pair's sign bits (bits k, k + 1 of sg moved to bits 15 and 31 by one multiply) flip
                // them: the f16 of the signed product, as rounding to nearest is symmetric.
                u32 plo = pack2h(db * 8.0f, db * 25.0f), phi = pack2h(db * 43.0f, 0.0f);
                u32 sw[2] = {(u32)sv, (u32)(sv >> 32)};
#pragma unroll
                for (int k = 0; k < 8; k += 2) {
                    u32 mag = prmt(plo, phi, sw[k >> 2] >> (8 * (k & 2)));
                    o[k / 2] = mag ^ (((sg >> k) * 0x40008000u) & 0x80008000u);
                }
            } else if (WT == MG_Q2K) {
                int s = (k0 >> 5) & 3;
                u32 sc = raw[q].z, dd = raw[q].w;
                float dl = h2f(dd & 0xffff) * (float)(sc & 15), ml = h2f(dd >> 16) * (float)(sc >> 4);
#pragma unroll
                for (int k = 0; k < 8; k += 2) {
                    u32 wv = k < 4 ? raw[q].x : raw[q].y;
                    int b0 = 8 * (k & 3);
                    float v0 = q2_float((wv >> (b0 + 2 * s)) & 3), v1 = q2_float((wv >> (b0 + 8 + 2 * s)) & 3);
                    o[k / 2] = (u32)f2h(dl * v0 - ml) | ((u32)f2h(dl * v1 - ml) << 16);
                }
            }
            *(uint4*)&wsh[st][rw * MG_LD + 8 * l] = make_uint4(o[0], o[1], o[2], o[3]);
        }
    };
    // IQ2_XXS: each grid entry's 8 bytes (8, 25 or 43) as byte-permute selectors of a 3-value f16
    // palette (8 bits a value: bytes 2i, 2i + 1 of palette value i; a pair's 16 bits make a word).
    if (WT == MG_IQ2S) {
        u64 gv = iq2xxs_grid[tid], sv = 0;
#pragma unroll
        for (int k = 0; k < 8; k++) {
            u32 b = (u32)(gv >> (8 * k)) & 255, i = b == 8 ? 0 : b == 25 ? 1 : 2;
            sv |= (u64)((2 * i) | ((2 * i + 1) << 4)) << (8 * k);
        }
        gsel[tid] = sv;
        __syncthreads();
    }
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
        // 16-token sub-tiles past the tile's tokens are skipped (warp-uniform): at small chunks an
        // expert holds ~12 tokens of a 64-token tile. Their outputs are never stored.
#pragma unroll
        for (int kk = 0; kk < MG_BK; kk += 16) {
            if (mts <= 0) break;
            u32 a[2][4], b[NT][2];
#pragma unroll
            for (int mt = 0; mt < 2; mt++) {
                if (mt >= mts) break;
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
                for (int nt = 0; nt < NT; nt++)
                    if (mt < mts) mma16816(acc[mt][nt], a[mt][0], a[mt][1], a[mt][2], a[mt][3], b[nt][0], b[nt][1]);
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

// Registers capped for 3 blocks an SM with 64-token tiles, 2 with 128 (the occupancy of the kernels
// before the per-thread sources were hoisted out of the loop).
#define MOE_GEMM(NAME, WT, BT) \
    extern "C" __global__ void __launch_bounds__(256, BT == 64 ? 3 : 2) NAME(const u8* __restrict__ W, u64 ws, const int4* __restrict__ tiles, const u16* __restrict__ X, \
                                                           float* __restrict__ Y, int K, int R, int n) { PDL_ENTRY moe_gemm_impl<WT, BT>(W, ws, tiles, X, Y, K, R, n); }
MOE_GEMM(moe_gemm, MG_F16, 64)
MOE_GEMM(moe_gemm_iq2s, MG_IQ2S, 64)
MOE_GEMM(moe_gemm_q2k, MG_Q2K, 64)
MOE_GEMM(moe_gemm_t128, MG_F16, 128)
MOE_GEMM(moe_gemm_iq2s_t128, MG_IQ2S, 128)
MOE_GEMM(moe_gemm_q2k_t128, MG_Q2K, 128)
