
// ---- Decode sub-layer entry in one launch ----

// Decode sub-layer entry for one token, fused: the hyper-connection mix projection (F16 rows `W`,
// nm x hd) over HCD_P column slices of 256 (one block each: slice dot products and the slice's part
// of sum(x^2)), then the last block to finish (ticket) reduces the slices in a fixed order and does
// what hc_pre_norm does: pre/post weights, the collapse Σ pre[s]·X[s], its RMS norm with weight `w`
// into xn, and optionally the Q8_0 / Q8_K copies of xn for the int8-activation mat-vecs. The raw
// mix goes to `mixraw` for hc_comb (Sinkhorn, on a side stream). 512 threads, smem e floats.
// (Replaces a 24-row mat-vec over 6 blocks, ~5 us, and a one-block kernel, ~10 us.)
#define HCD_T 512
#define HCD_V 16  // passes of HCD_T values: e <= 8192
extern "C" __global__ void __launch_bounds__(HCD_T) hc_pre_dec(const u16* __restrict__ W, int nm, const float* __restrict__ x, int e, int nh,
                                                             float* __restrict__ part, int* ticket, const float* __restrict__ scale,
                                                             const float* __restrict__ base, float hc_eps, float* __restrict__ mixraw,
                                                             float* __restrict__ mixes, const float* __restrict__ w, float eps, float* __restrict__ xn,
                                                             signed char* q80, float* d80, signed char* q8k, float* d8k) { PDL_ENTRY
    __shared__ double redd[32];
    __shared__ float mix[64];
    __shared__ float pre[16];
    __shared__ int last;
    extern __shared__ float curs[];  // e floats
    int hd = nh * e, P = gridDim.x, p = blockIdx.x, t = threadIdx.x, lane = t & 31, wid = t >> 5;
    // The norm weights are read by the last block only, after two reductions: every block asks L2
    // for its share of them now.
    if (w)
        for (int l = p + P * t; l < (e * 4 + 127) / 128; l += P * HCD_T) asm volatile("prefetch.global.L2 [%0];" ::"l"(w + 32 * l));
    // Slice p: columns 256p + 8 lane .. +8; warp wid takes rows wid, wid + 16, ...
    int c0 = 256 * p + 8 * lane;
    float xv[8];
    {
        float4 a = *(const float4*)(x + c0), b = *(const float4*)(x + c0 + 4);
        xv[0] = a.x; xv[1] = a.y; xv[2] = a.z; xv[3] = a.w; xv[4] = b.x; xv[5] = b.y; xv[6] = b.z; xv[7] = b.w;
    }
    // Slice record: nm floats, then sum(x^2) as a double at an 8-byte aligned offset.
    int pst = (nm + 3) & ~1, pss = (nm + 1) & ~1;
    float* pp = part + (u64)p * pst;
    for (int r = wid; r < nm; r += HCD_T / 32) {
        uint4 wq = *(const uint4*)(W + (u64)r * hd + c0);
        u32 ww[4] = {wq.x, wq.y, wq.z, wq.w};
        float s = 0.0f;
#pragma unroll
        for (int u = 0; u < 4; u++) {
            s += h2f((u16)(ww[u] & 0xffff)) * xv[2 * u];
            s += h2f((u16)(ww[u] >> 16)) * xv[2 * u + 1];
        }
        s = warp_sum(s);
        if (lane == 0) pp[r] = s;
    }
    if (wid == HCD_T / 32 - 1) {
        double ss = 0.0;
#pragma unroll
        for (int u = 0; u < 8; u++) ss += (double)xv[u] * (double)xv[u];
        ss = warp_sum_d(ss);
        if (lane == 0) *(double*)(pp + pss) = ss;
    }
    // Publish the slice, then take a ticket; the last block continues.
    __threadfence();
    __syncthreads();
    if (t == 0) {
        int k = atomicAdd(ticket, 1);
        last = k == P - 1;
        if (last) *ticket = 0;  // ready for the next launch (graph replay)
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
    // The tail's inputs that do not depend on the reduction are requested first (the norm weights
    // were read pass by pass after the reductions: one DRAM round trip per pass).
    float wv[HCD_V];
#pragma unroll
    for (int q = 0; q < HCD_V; q++) {
        int j = q * HCD_T + t;
        wv[q] = w && j < e ? w[j] : 1.0f;
    }
    float sc0 = scale[0], sc1 = scale[1];
    float b0 = t < nh ? base[t] : 0.0f, b1 = t < nh ? base[nh + t] : 0.0f;
    // Reduce the slices in slice order per row (warp r: lanes take slices, a fixed shuffle tree).
    for (int r = wid; r <= nm; r += HCD_T / 32) {
        double v2[2];
#pragma unroll
        for (int h = 0; h < 2; h++) {
            int q = h * 32 + lane;
            v2[h] = q >= P ? 0.0 : r < nm ? (double)__ldcg(part + (u64)q * pst + r) : __ldcg((const double*)(part + (u64)q * pst + pss));
        }
        double acc = v2[0] + v2[1];
        for (int q0 = 64; q0 < P; q0 += 32) {
            int q = q0 + lane;
            if (q < P) acc += r < nm ? (double)__ldcg(part + (u64)q * pst + r) : __ldcg((const double*)(part + (u64)q * pst + pss));
        }
        acc = warp_sum_d(acc);
        if (lane == 0) {
            if (r < nm) mix[r] = (float)acc;
            else redd[0] = acc;
        }
    }
    __syncthreads();
    double ssx = redd[0];
    float inv = 1.0f / sqrtf((float)(ssx / hd) + eps);
    if (t < nm) mixraw[t] = mix[t];
    if (t < nh) {
        pre[t] = sigmoidf_(mix[t] * inv * sc0 + b0) + hc_eps;
        mixes[t] = 2.0f * sigmoidf_(mix[nh + t] * inv * sc1 + b1);
    }
    __syncthreads();
    double s2 = hc_collapse(x, pre, nh, e, curs);
    s2 = block_sum_d(s2, redd);
    float inv2 = 1.0f / sqrtf((float)(s2 / e) + eps);
    // e is a multiple of 256 and at most HCD_V * HCD_T (checked on the host): in every pass a warp's
    // 32 values are one Q8_0 block and 8 warps' 256 one Q8_K block (whole warps on or off).
    float vv[HCD_V];
#pragma unroll
    for (int q = 0; q < HCD_V; q++) {
        int j = q * HCD_T + t;
        vv[q] = j < e ? (w ? curs[j] * inv2 * wv[q] : curs[j] * inv2) : 0.0f;
        if (j < e) xn[j] = vv[q];
    }
    if (q80) {
#pragma unroll
        for (int q = 0; q < HCD_V; q++)
            if (q * HCD_T + t < e) q80_warp(vv[q], q * HCD_T + t, q80, d80);
    }
    if (q8k) {
        // One exchange of the warps' largest keys for every pass.
        __shared__ u64 redk[HCD_V][HCD_T / 32];
#pragma unroll
        for (int q = 0; q < HCD_V; q++) {
            if (q * HCD_T >= e) break;
            u64 k = warp_max_u64(q8k_key(vv[q], t & 255));
            if (lane == 0) redk[q][wid] = k;
        }
        __syncthreads();
#pragma unroll
        for (int q = 0; q < HCD_V; q++) {
            int j = q * HCD_T + t;
            if (j >= e) break;
            u64 k = redk[q][wid & ~7];
#pragma unroll
            for (int i = 1; i < 8; i++) k = redk[q][(wid & ~7) + i] > k ? redk[q][(wid & ~7) + i] : k;
            q8k_store(vv[q], k, j >> 8, t & 255, q8k, d8k);
        }
    }
}

