
// ---------------------------------------------------------------------------------------------
// Grouped expert GEMM for prefill, one launch per matrix kind over every expert's tokens (a cuBLAS
// call per expert costs more host time than its ~100-token product takes on the GPU). Tile b covers
// tokens rows tiles[b].y .. + tiles[b].z (< 64) of the gathered activations X (f16, ld K) against
// weight slot tiles[b].x (f16, R x K, slots ws elements apart), rows blockIdx.y * 128 .. + 128:
// Y[row0 + t][r] = sum_k X[row0 + t][k] * W[r][k] (f32, ld R). mma.sync m16n8k16 (f16, f32
// accumulation); 8 warps as 2 (32 tokens) x 4 (32 rows); K in steps of 32, double-buffered cp.async.
// ---------------------------------------------------------------------------------------------
#define MG_BT 64
#define MG_BR 128
#define MG_BK 32
#define MG_LD 40  // f16 row stride in shared memory (80 bytes: conflict-free fragment loads)

__device__ __forceinline__ u32 smem_addr(const void* p) {
    u32 a;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
    return a;
}
// 16-byte asynchronous copy global -> shared; `bytes` < 16 zero-fills the rest (0: all zeros).
__device__ __forceinline__ void cp_async16(void* dst, const void* src, int bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src), "r"(bytes));
}

extern "C" __global__ void __launch_bounds__(256) moe_gemm(const u16* __restrict__ W, u64 ws, const int4* __restrict__ tiles, const u16* __restrict__ X,
                                                           float* __restrict__ Y, int K, int R) {
    __shared__ __align__(16) u16 xs[2][MG_BT * MG_LD];
    __shared__ __align__(16) u16 wsh[2][MG_BR * MG_LD];
    int4 tl = tiles[blockIdx.x];
    const u16* Wb = W + (u64)tl.x * ws + (u64)blockIdx.y * MG_BR * K;
    const u16* Xb = X + (u64)tl.y * K;
    int m = tl.z;
    int tid = threadIdx.x, lane = tid & 31, w = tid >> 5;
    int wt = w & 1, wr = w >> 1, g = lane >> 2, t = lane & 3;
    // X tile: 64 rows x 64 bytes = 256 chunks of 16 bytes (one per thread); W tile: 512 (two each).
    auto load = [&](int st, int k0) {
        int r = tid >> 2, c = (tid & 3) * 8;
        bool ok = r < m;
        cp_async16(&xs[st][r * MG_LD + c], ok ? Xb + (u64)r * K + k0 + c : Xb, ok ? 16 : 0);
#pragma unroll
        for (int q = 0; q < 2; q++) {
            int u = tid + q * 256;
            int rw = u >> 2, cw = (u & 3) * 8;
            cp_async16(&wsh[st][rw * MG_LD + cw], Wb + (u64)rw * K + k0 + cw, 16);
        }
        asm volatile("cp.async.commit_group;\n");
    };
    float acc[2][4][4];
#pragma unroll
    for (int a = 0; a < 2; a++)
#pragma unroll
        for (int b = 0; b < 4; b++) acc[a][b][0] = acc[a][b][1] = acc[a][b][2] = acc[a][b][3] = 0.0f;
    int nk = K / MG_BK;
    load(0, 0);
    for (int kt = 0; kt < nk; kt++) {
        if (kt + 1 < nk) {
            load((kt + 1) & 1, (kt + 1) * MG_BK);
            asm volatile("cp.async.wait_group 1;\n");
        } else {
            asm volatile("cp.async.wait_group 0;\n");
        }
        __syncthreads();
        const u16* xa = xs[kt & 1];
        const u16* wb = wsh[kt & 1];
#pragma unroll
        for (int kk = 0; kk < MG_BK; kk += 16) {
            u32 a[2][4], b[4][2];
#pragma unroll
            for (int mt = 0; mt < 2; mt++) {
                const u16* p = xa + (wt * 32 + mt * 16 + g) * MG_LD + kk + 2 * t;
                a[mt][0] = *(const u32*)p;
                a[mt][1] = *(const u32*)(p + 8 * MG_LD);
                a[mt][2] = *(const u32*)(p + 8);
                a[mt][3] = *(const u32*)(p + 8 * MG_LD + 8);
            }
#pragma unroll
            for (int nt = 0; nt < 4; nt++) {
                const u16* p = wb + (wr * 32 + nt * 8 + g) * MG_LD + kk + 2 * t;
                b[nt][0] = *(const u32*)p;
                b[nt][1] = *(const u32*)(p + 8);
            }
#pragma unroll
            for (int mt = 0; mt < 2; mt++)
#pragma unroll
                for (int nt = 0; nt < 4; nt++) mma16816(acc[mt][nt], a[mt][0], a[mt][1], a[mt][2], a[mt][3], b[nt][0], b[nt][1]);
        }
        __syncthreads();
    }
    // c0, c1: token g, rows 2t, 2t+1; c2, c3: token g + 8.
#pragma unroll
    for (int mt = 0; mt < 2; mt++)
#pragma unroll
        for (int nt = 0; nt < 4; nt++) {
            int tok = wt * 32 + mt * 16 + g;
            int row = blockIdx.y * MG_BR + wr * 32 + nt * 8 + 2 * t;
            if (tok < m) *(float2*)(Y + (u64)(tl.y + tok) * R + row) = make_float2(acc[mt][nt][0], acc[mt][nt][1]);
            if (tok + 8 < m) *(float2*)(Y + (u64)(tl.y + tok + 8) * R + row) = make_float2(acc[mt][nt][2], acc[mt][nt][3]);
        }
}
