
// ---- Decode sub-layer entry with the previous sub-layer's exit folded in ----

// Grid-wide barrier of the P blocks of a launch (all co-resident: P is small and nothing they wait
// for needs their SMs). The last block to arrive resets the count, then flips the flag the others
// spin on; a block reads the flag before arriving, so it cannot miss the flip. A bounded spin traps
// (a kernel error instead of a hung stream) if a block never arrives.
__device__ __forceinline__ u32 ld_acquire(const int* p) {
    u32 v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ void grid_barrier(int* cnt, int* flag, int P) {
    __syncthreads();
    if (threadIdx.x == 0) {
        u32 f0 = ld_acquire(flag);
        __threadfence();
        if (atomicAdd(cnt, 1) == P - 1) {
            *cnt = 0;
            __threadfence();
            atomicExch(flag, (int)(f0 ^ 1u));
        } else {
            u32 spins = 0;
            while (ld_acquire(flag) == f0)
                if (++spins > (1u << 30)) __trap();
        }
        __threadfence();
    }
    __syncthreads();
}

// One-token sub-layer entry, every block finishing its own columns. Block p owns columns
// 256p .. 256p+255 of all nh streams (thread t: column 256p + t):
//  1. the previous sub-layer's exit, if pending (xmode 1: y = ey, the attention output; 2: y = the k
//     weighted expert rows of ey plus eadd, the shared expert): X'[c] = post[c]·y + Σ_r comb[r][c]·X[r]
//     with the previous mixes, in the order hc_post / moe_combine_post use, written back to x;
//  2. the block's part of the mix projection (F16 rows W, nm x nh·e) and of the streams' Gram matrix
//     (double), published;
//  3. barrier; every block reduces the parts in the same fixed order (identical results in all
//     blocks): the flat RMS factor (the trace), pre/post weights (block 0 stores post and the raw mix
//     for hc_comb), Σ cur² = preᵀ·G·pre, then the collapse of its columns, their RMS norm (weight w)
//     into xn and the Q8_0 / Q8_K copies.
// The FFN's router is a launch of its own (gate_route_dec, 64 blocks): beside the shared expert's
// products it measured 2.9 % faster decode than in these 16 blocks after the barrier.
// Replaces hc_post or moe_combine_post plus hc_pre_dec, whose single finishing block did the whole
// collapse. Grid (e/256, tokens) blocks of 256 threads, every block of the grid resident (the grid
// barrier); nh <= HCE_NH, nm <= HCE_NM.
#define HCE_NH 5
#define HCE_NM 35
#define HCE_NG 15                          // Gram entries: HCE_NH (HCE_NH + 1) / 2
#define HCE_GI(s, u) ((s) * HCE_NH - (s) * ((s) - 1) / 2 + (u) - (s))
#define HCE_RR ((HCE_NM + HCE_NG + 7) / 8)  // rows of the reduction a warp
extern "C" __global__ void __launch_bounds__(256, 1) hc_entry_dec(const u16* __restrict__ W, int nm, float* __restrict__ x, int e, int nh,
                                                               float* __restrict__ part, int* bar, const float* __restrict__ scale,
                                                               const float* __restrict__ base, float hc_eps, float* __restrict__ mixraw,
                                                               float* __restrict__ mixes, const float* __restrict__ w, float eps,
                                                               float* __restrict__ xn, signed char* q80, float* d80, signed char* q8k, float* d8k,
                                                               int xmode, const float* __restrict__ ey, int ek, const float* __restrict__ eadd) { PDL_TRIGGER
    // Before waiting for the previous kernel (it may still run; PDL): this block's slices of the
    // weights into L2: the mix rows (nm x nh runs of 512 bytes) and the norm weights (1 KB); read
    // after the wait, they no longer cost a DRAM round trip.
    {
        int t = threadIdx.x, p = blockIdx.x, hd = nh * e;
        for (int l = t; l < nm * nh * 4; l += 256) {
            int r = l / (nh * 4), s = (l >> 2) % nh;
            asm volatile("prefetch.global.L2 [%0];" ::"l"(W + (u64)r * hd + (u64)s * e + 256 * p + 64 * (l & 3)));
        }
        if (w && t < 8) asm volatile("prefetch.global.L2 [%0];" ::"l"(w + 256 * p + 32 * t));
    }
    PDL_WAIT
    // Several tokens (exact rows: a verify step's, each computed as its decode step): grid row y is
    // the launch's token y, with its own streams, outputs, exit inputs and its own parts and barrier
    // (4 ints a row at `bar`: count and flag; the third is the row's gate_route_dec ticket). Decode:
    // one row, y = 0.
    // A block's part: nm floats, then (from an even slot) the HCE_NG Gram doubles.
    const int pss = (nm + 1) & ~1, pst = pss + 2 * HCE_NG;
    if (blockIdx.y) {
        const u64 row = blockIdx.y, P = gridDim.x;
        x += row * nh * e;
        part += row * P * pst;
        bar += 4 * row;
        mixraw += row * nm;
        mixes += row * (nh + nh * nh);
        xn += row * e;
        if (q80) { q80 += row * e; d80 += row * (e / 32); }
        if (q8k) { q8k += row * e; d8k += row * (e / 256); }
        if (xmode == 1) ey += row * e;
        if (xmode == 2) ey += row * ek * e;
        if (eadd) eadd += row * e;
    }
    __shared__ __align__(16) float xs[HCE_NH][256];  // read as float4
    __shared__ float red[8][HCE_NM];
    __shared__ float redg[8][HCE_NG];
    __shared__ float mix[HCE_NM];
    __shared__ double gram[HCE_NG];
    __shared__ u64 redk[8];
    int P = gridDim.x, p = blockIdx.x, t = threadIdx.x, lane = t & 31, wid = t >> 5;
    int hd = nh * e, j = 256 * p + t;
    float wj = w ? w[j] : 1.0f;
    float xv[HCE_NH];
#pragma unroll
    for (int s = 0; s < HCE_NH; s++) xv[s] = s < nh ? x[(u64)s * e + j] : 0.0f;
    if (xmode) {
        float yv;
        if (xmode == 1) {
            yv = ey[j];
        } else {
            // Every row's load in flight before the sum in slot order (ek <= 16).
            float ev[16];
#pragma unroll
            for (int s = 0; s < 16; s++) ev[s] = s < ek ? ey[(u64)s * e + j] : 0.0f;
            float ad = eadd ? eadd[j] : 0.0f;
            float acc = 0.0f;
#pragma unroll
            for (int s = 0; s < 16; s++)
                if (s < ek) acc += ev[s];
            if (eadd) acc += ad;
            yv = acc;
        }
        float nv[HCE_NH];
#pragma unroll
        for (int c = 0; c < HCE_NH; c++) {
            if (c >= nh) break;
            // The rounding of hc_post / moe_combine_post, spelled out the same way there.
            float o = __fmul_rn(mixes[c], yv);
#pragma unroll
            for (int r = 0; r < HCE_NH; r++)
                if (r < nh) o = __fmaf_rn(mixes[nh + r * nh + c], xv[r], o);
            nv[c] = o;
        }
#pragma unroll
        for (int c = 0; c < HCE_NH; c++)
            if (c < nh) {
                xv[c] = nv[c];
                x[(u64)c * e + j] = nv[c];
            }
    }
#pragma unroll
    for (int s = 0; s < HCE_NH; s++)
        if (s < nh) xs[s][t] = xv[s];
    __syncthreads();
    // Mix projection part: thread chunk c = 4 columns of one stream, every row's 4 weights in flight.
    float acc[HCE_NM];
#pragma unroll
    for (int r = 0; r < HCE_NM; r++) acc[r] = 0.0f;
    for (int c = t; c < nh * 64; c += 256) {
        int s = c >> 6, c4 = (c & 63) * 4;
        float4 xq = *(const float4*)&xs[s][c4];
        const u16* wp = W + (u64)s * e + 256 * p + c4;
        uint2 wq[HCE_NM];
#pragma unroll
        for (int r = 0; r < HCE_NM; r++)
            if (r < nm) wq[r] = *(const uint2*)(wp + (u64)r * hd);
#pragma unroll
        for (int r = 0; r < HCE_NM; r++)
            if (r < nm) {
                float a = acc[r];
                a += h2f((u16)(wq[r].x & 0xffff)) * xq.x;
                a += h2f((u16)(wq[r].x >> 16)) * xq.y;
                a += h2f((u16)(wq[r].y & 0xffff)) * xq.z;
                a += h2f((u16)(wq[r].y >> 16)) * xq.w;
                acc[r] = a;
            }
    }
    // The warp's sums: mix rows 0..31 by one butterfly (lane r ends with row r), rows past 31 one by
    // one; then the Gram matrix of the streams over the warp's columns, G[s][u] = Σ X'[s]·X'[u] (u >= s,
    // entry (s, u) at slot HCE_GI(s, u); xv is zero past nh): its trace is the flat RMS sum and
    // preᵀ·G·pre the collapse's Σ cur², so one grid barrier serves both norms.
    {
        float a[32];
#pragma unroll
        for (int r = 0; r < 32; r++) a[r] = r < nm ? acc[r] : 0.0f;
        float v = warp_sum_scatter<32>(a);
        if (lane < nm) red[wid][lane] = v;
#pragma unroll
        for (int r = 32; r < HCE_NM; r++)
            if (r < nm) {
                float v2 = warp_sum(acc[r]);
                if (lane == 0) red[wid][r] = v2;
            }
        float g[16];
#pragma unroll
        for (int s = 0; s < HCE_NH; s++)
#pragma unroll
            for (int u = s; u < HCE_NH; u++) g[HCE_GI(s, u)] = xv[s] * xv[u];
        g[15] = 0.0f;
        float gv = warp_sum_scatter<16>(g);
        if ((lane & 1) == 0 && (lane >> 1) < HCE_NG) redg[wid][lane >> 1] = gv;
    }
    __syncthreads();
    float* pp = part + (u64)p * pst;
    if (t < nm) {
        float v = 0.0f;
        for (int q = 0; q < 8; q++) v += red[q][t];
        pp[t] = v;
    } else if (t >= 64 && t < 64 + HCE_NG) {
        double v = 0.0;
        for (int q = 0; q < 8; q++) v += (double)redg[q][t - 64];
        ((double*)(pp + pss))[t - 64] = v;
    }
    grid_barrier(bar, bar + 1, P);
    // Every block reduces the P parts in the same order (warp per row, lane q holds part q, one tree);
    // a warp's rows (wid, wid + 8, ..: the nm mix values, then the HCE_NG Gram entries) are all loaded
    // before the trees.
    {
        double a[HCE_RR];
#pragma unroll
        for (int i = 0; i < HCE_RR; i++) {
            int r = wid + 8 * i;
            a[i] = r >= nm + HCE_NG || lane >= P ? 0.0 : r < nm ? (double)__ldcg(part + (u64)lane * pst + r) : __ldcg((const double*)(part + (u64)lane * pst + pss) + (r - nm));
        }
#pragma unroll
        for (int i = 0; i < HCE_RR; i++) {
            int r = wid + 8 * i;
            if (r >= nm + HCE_NG) break;
            double v = warp_sum_d(a[i]);
            if (lane == 0) {
                if (r < nm) mix[r] = (float)v;
                else gram[r - nm] = v;
            }
        }
    }
    __syncthreads();
    double tr = 0.0;
#pragma unroll
    for (int s = 0; s < HCE_NH; s++) tr += gram[HCE_GI(s, s)];
    float inv = 1.0f / sqrtf((float)(tr / hd) + eps);
    float pr[HCE_NH];
#pragma unroll
    for (int s = 0; s < HCE_NH; s++) pr[s] = s < nh ? sigmoidf_(mix[s] * inv * scale[0] + base[s]) + hc_eps : 0.0f;
    if (p == 0) {
        // The previous mixes were read by every block before the barrier.
        if (t < nm) mixraw[t] = mix[t];
        if (t < nh) mixes[t] = 2.0f * sigmoidf_(mix[nh + t] * inv * scale[1] + base[nh + t]);
    }
    float cur = 0.0f;
#pragma unroll
    for (int s = 0; s < HCE_NH; s++)
        if (s < nh) cur += pr[s] * xv[s];
    // Σ cur² = Σ_s Σ_u pre[s]·pre[u]·G[s][u], the same in every thread and block.
    double s2 = 0.0;
#pragma unroll
    for (int s = 0; s < HCE_NH; s++)
#pragma unroll
        for (int u = s; u < HCE_NH; u++) {
            double g = gram[HCE_GI(s, u)] * (double)pr[s] * (double)pr[u];
            s2 += u == s ? g : 2.0 * g;
        }
    float inv2 = 1.0f / sqrtf((float)(s2 / e) + eps);
    float v = w ? cur * inv2 * wj : cur * inv2;
    xn[j] = v;
    if (q80) q80_warp(v, j, q80, d80);
    if (q8k) q8k_group(v, p, true, q8k, d8k, redk);
}
