
// ---------------------------------------------------------------------------------------------
// Grouped expert GEMM for prefill, one launch per matrix kind over every expert's tokens (a cuBLAS
// call per expert costs more host time than its ~100-token product takes on the GPU). Tile b covers
// tokens rows tiles[b].y .. + tiles[b].z (< 64) of the gathered activations X (f16, ld K) against
// weight slot tiles[b].x (R x K, slots ws bytes apart), rows blockIdx.y * 128 .. + 128:
// Y[row0 + t][r] = sum_k X[row0 + t][k] * W[r][k] (f32, ld R). mma.sync m16n8k16 (f16, f32
// accumulation); tiles of BT = 64 tokens (8 warps as 2 (32 tokens) x 4 (32 rows)) or 128 (4 x 2 (64
// rows): an expert's weights decoded once for up to 128 tokens); K in steps of 64, double-buffered.
// Every output sums its products in the same order for either BT (bit-identical).
// Weights are f16 (cp.async), or IQ2_XXS (split layout) / Q2_K read as stored: the next step's raw
// words are loaded into registers before this step's MMAs and decoded to f16 in shared memory after
// them (store_w). Shared memory is dynamic (moe_gemm_smem on the host).
// ---------------------------------------------------------------------------------------------
#define MG_BR 128
#define MG_BK 64
#define MG_LD 72  // f16 row stride in shared memory (144 bytes: conflict-free fragment loads and stores)

#define MG_F16 0
#define MG_IQ2S 1
#define MG_Q2K 2

// Byte permute (PTX prmt: the selector's nibbles are used as they are; ours stay below 8).
__device__ __forceinline__ u32 prmt(u32 a, u32 b, u32 sel) {
    u32 r;
    asm("prmt.b32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(sel));
    return r;
}

// Raw words of one thread's 32-value block of a step: IQ2_XXS a0, a1 and the f16 scale; Q2_K the 8
// quant words (32 bytes, 2 bits a value at the block's shift), the two 16-value scale bytes and d/dmin.
struct MgRaw {
    u32 w[8];
    u32 sc, dd;
};

template <int WT, int BT> __device__ __forceinline__ void moe_gemm_impl(const u8* __restrict__ W, u64 ws, const int4* __restrict__ tiles, const u16* __restrict__ X,
                                                                       float* __restrict__ Y, int K, int R, int n) {
    constexpr int WTN = BT / 32, RW = MG_BR * WTN / 8, NT = RW / 8;  // token warps, rows a warp, its 8-row tiles
    extern __shared__ __align__(16) u16 mg_smem[];
    u16* xs = mg_smem;                    // [2][BT * MG_LD]
    u16* wsh = xs + 2 * BT * MG_LD;       // [2][MG_BR * MG_LD]
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
    // Per-thread sources, computed once (the loop only adds the step's offset). X tile: BT rows x 128
    // bytes = BT * 8 chunks of 16 bytes (zero-filled past the tile's m tokens); f16 W tile: 1024 chunks
    // of 8 values (four per thread); quantized W: thread tid decodes row tid / 2's 32-value block tid % 2.
    const u16* xsrc[BT / 32];
    int xdst[BT / 32], xbytes[BT / 32];
#pragma unroll
    for (int q = 0; q < BT / 32; q++) {
        int u = tid + 256 * q, r = u >> 3, c = (u & 7) * 8;
        xbytes[q] = r < m ? 16 : 0;
        xsrc[q] = r < m ? Xb + (u64)r * K + c : Xb;
        xdst[q] = r * MG_LD + c;
    }
    const int qrow = tid >> 1, qhalf = tid & 1;
    const u8* wrow = Wb + (u64)qrow * rb;
    auto load_x = [&](int st, int k0) {
#pragma unroll
        for (int q = 0; q < BT / 32; q++) cp_async16(&xs[st * BT * MG_LD + xdst[q]], xbytes[q] ? xsrc[q] + k0 : Xb, xbytes[q]);
        if (WT == MG_F16) {
#pragma unroll
            for (int q = 0; q < 4; q++) {
                int u = tid + q * 256, rw = u >> 3, cw = (u & 7) * 8;
                cp_async16(&wsh[st * MG_BR * MG_LD + rw * MG_LD + cw], Wb + (u64)rw * rb + 2 * (k0 + cw), 16);
            }
        }
        asm volatile("cp.async.commit_group;\n");
    };
    MgRaw raw;
    auto fetch_w = [&](int k0) {
        int c = k0 >> 8, q8 = ((k0 >> 5) & 7) + qhalf;
        if (WT == MG_IQ2S) {
            const u8* p = wrow + 64 * c + 8 * q8;
            raw.w[0] = *(const u32*)p;
            raw.w[1] = *(const u32*)(p + 4);
            raw.dd = ld16(wrow + nb * 64 + 2 * c);
        } else if (WT == MG_Q2K) {
            const u8* b = wrow + c * 84;
            int h = q8 >> 2, s = q8 & 3;
#pragma unroll
            for (int i = 0; i < 8; i++) raw.w[i] = *(const u32*)(b + 16 + 32 * h + 4 * i);
            raw.sc = ld16(b + 8 * h + 2 * s);
            raw.dd = *(const u32*)(b + 80);
        }
    };
    // The thread's 32 values of step k0 decoded to f16 in wsh[st], with the formulas of dq_iq2s /
    // dq_q2_k (the same f16 values as dequantizing first): each value is one of a few levels (IQ2_XXS
    // db x 8, 25, 43; Q2_K dl q - ml, q = 0..3), rounded to f16 once, and a byte permute of that
    // palette picks a pair's levels (IQ2_XXS: selectors per grid entry, then the sign bits moved to
    // bits 15 and 31 by one multiply flip them, f16 rounding being symmetric; Q2_K: selector nibbles
    // 2q, 2q + 1 made from the pair's 2-bit fields by one multiply-add).
    auto store_w = [&](int st, int k0) {
        u32 o[16];
        if (WT == MG_IQ2S) {
            u32 a0 = raw.w[0], a1 = raw.w[1];
            float db = h2f((u16)raw.dd) * (0.5f + (float)(a1 >> 28)) * 0.25f;
            u32 plo = pack2h(db * 8.0f, db * 25.0f), phi = pack2h(db * 43.0f, 0.0f);
#pragma unroll
            for (int l = 0; l < 4; l++) {
                u64 sv = gsel[(a0 >> (8 * l)) & 255];
                u32 sg = ksign((a1 >> (7 * l)) & 127);
                u32 sw[2] = {(u32)sv, (u32)(sv >> 32)};
#pragma unroll
                for (int k = 0; k < 8; k += 2) o[4 * l + k / 2] = prmt(plo, phi, sw[k >> 2] >> (8 * (k & 2))) ^ (((sg >> k) * 0x40008000u) & 0x80008000u);
            }
        } else if (WT == MG_Q2K) {
            int s = ((k0 >> 5) + qhalf) & 3;
            float d = h2f(raw.dd & 0xffff), dm = h2f(raw.dd >> 16);
#pragma unroll
            for (int hf = 0; hf < 2; hf++) {
                u32 sc = (raw.sc >> (8 * hf)) & 255;
                float dl = d * (float)(sc & 15), ml = dm * (float)(sc >> 4);
                u32 plo = pack2h(fmaf(dl, 0.0f, -ml), fmaf(dl, 1.0f, -ml)), phi = pack2h(fmaf(dl, 2.0f, -ml), fmaf(dl, 3.0f, -ml));
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    u32 tq = raw.w[4 * hf + i] >> (2 * s);
                    o[8 * hf + 2 * i] = prmt(plo, phi, (tq & 0x0303u) * 0x22u + 0x1010u);
                    o[8 * hf + 2 * i + 1] = prmt(plo, phi, ((tq >> 16) & 0x0303u) * 0x22u + 0x1010u);
                }
            }
        }
        u16* dst = &wsh[st * MG_BR * MG_LD + qrow * MG_LD + 32 * qhalf];
#pragma unroll
        for (int q = 0; q < 4; q++) *(uint4*)(dst + 8 * q) = make_uint4(o[4 * q], o[4 * q + 1], o[4 * q + 2], o[4 * q + 3]);
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
        const u16* xa = xs + (kt & 1) * BT * MG_LD;
        const u16* wb = wsh + (kt & 1) * MG_BR * MG_LD;
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

#define MOE_GEMM(NAME, WT, BT) \
    extern "C" __global__ void __launch_bounds__(256, BT == 64 ? 3 : 2) NAME(const u8* __restrict__ W, u64 ws, const int4* __restrict__ tiles, const u16* __restrict__ X, \
                                                           float* __restrict__ Y, int K, int R, int n) { PDL_ENTRY moe_gemm_impl<WT, BT>(W, ws, tiles, X, Y, K, R, n); }
MOE_GEMM(moe_gemm, MG_F16, 64)
MOE_GEMM(moe_gemm_iq2s, MG_IQ2S, 64)
MOE_GEMM(moe_gemm_q2k, MG_Q2K, 64)
MOE_GEMM(moe_gemm_t128, MG_F16, 128)
MOE_GEMM(moe_gemm_iq2s_t128, MG_IQ2S, 128)
MOE_GEMM(moe_gemm_q2k_t128, MG_Q2K, 128)
