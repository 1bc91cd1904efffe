
// ---------------------------------------------------------------------------------------------
// Hyper-connection helpers shared by hc.cu and the fused decode entry (hc_decode.cu).
// ---------------------------------------------------------------------------------------------
// Sinkhorn combination matrix of one token (one warp; lanes = matrix elements, sums gathered by
// shuffles in the CPU's sequential order), from the raw mix projection scaled by `inv`.
__device__ __forceinline__ void hc_comb_warp(const float* mr, float inv, const float* scale, const float* base, int nh, int iters, float hc_eps, float* mo) {
    int lane = threadIdx.x & 31, r = lane / nh, k = lane % nh;
    bool on = lane < nh * nh;
    float c = on ? mr[2 * nh + lane] * inv * scale[2] + base[2 * nh + lane] : 0.0f;
    float mx = -INFINITY;
    for (int q = 0; q < nh; q++) mx = fmaxf(mx, __shfl_sync(0xffffffffu, c, r * nh + q));
    float ev = expf(c - mx);
    float sm = 0.0f;
    for (int q = 0; q < nh; q++) sm += __shfl_sync(0xffffffffu, ev, r * nh + q);
    c = ev / sm + hc_eps;
    for (int it = 0; it < iters; it++) {
        if (it > 0) {
            float tt = 0.0f;
            for (int q = 0; q < nh; q++) tt += __shfl_sync(0xffffffffu, c, r * nh + q);
            c = c / (tt + hc_eps);
        }
        float tt = 0.0f;
        for (int q = 0; q < nh; q++) tt += __shfl_sync(0xffffffffu, c, q * nh + k);
        c = c / (tt + hc_eps);
    }
    if (on) mo[nh + lane] = c;
}

// The collapse cur[j] = Σ_s pre[s]·X[s][j] of `nh` (<= 16) streams of `e` (stream s at xi + s*e) into
// `curs`, four columns of a thread at a time with all their loads in flight; returns this thread's part
// of Σ cur² in double (columns threadIdx.x, +blockDim.x, .. in that order).
__device__ __forceinline__ double hc_collapse(const float* __restrict__ xi, const float* pre, int nh, int e, float* curs) {
    double s2 = 0.0;
    for (int j0 = threadIdx.x; j0 < e; j0 += 4 * blockDim.x) {
        float xv[4][16];
#pragma unroll
        for (int u = 0; u < 4; u++)
#pragma unroll
            for (int s = 0; s < 16; s++) {
                int j = j0 + u * blockDim.x;
                xv[u][s] = s < nh && j < e ? xi[s * e + j] : 0.0f;
            }
#pragma unroll
        for (int u = 0; u < 4; u++) {
            int j = j0 + u * blockDim.x;
            if (j >= e) break;
            float o = 0.0f;
#pragma unroll
            for (int s = 0; s < 16; s++)
                if (s < nh) o += pre[s] * xv[u][s];
            curs[j] = o;
            s2 += (double)o * (double)o;
        }
    }
    return s2;
}

