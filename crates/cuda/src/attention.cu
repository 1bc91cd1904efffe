// ---------------------------------------------------------------------------------------------
// Attention with sinks. Block = (token i, group of HG heads), 256 threads. Candidates: the raw
// window (batch rows for positions >= pos0, ring rows before), then compressed rows (all `nc`, or
// the indexer's selection when `sel` is set and nc > topk). The output gets the inverse rope.
// ---------------------------------------------------------------------------------------------
// Inverse rope on the tail (pairs live inside one float4) and store of 4 output dims.
__device__ __forceinline__ float4 attn_store(float4 acc, int k, int d, int half, long long pos, const double* freqs, float* orow) {
    int tail0 = d - 2 * half;
    float vals[4] = {acc.x, acc.y, acc.z, acc.w};
    for (int t = 0; t < 4; t += 2) {
        int jj = k + t;
        if (jj >= tail0) {
            int kk = (jj - tail0) >> 1;
            double s, cth;
            sincos((double)pos * freqs[kk], &s, &cth);
            float sf = -(float)s, cf = (float)cth;
            float x0 = vals[t], x1 = vals[t + 1];
            vals[t] = x0 * cf - x1 * sf;
            vals[t + 1] = x0 * sf + x1 * cf;
        }
    }
    float4 r = make_float4(vals[0], vals[1], vals[2], vals[3]);
    *(float4*)(orow + k) = r;
    return r;
}

template <int HG>
__device__ void attn_impl(const float* __restrict__ q, const float* __restrict__ kvb, const float* __restrict__ ring, const float* __restrict__ comp,
                          const int* __restrict__ sel, const float* __restrict__ sinks, float* __restrict__ o, int nh, int d, long long pos0, int swa,
                          int ratio, int topk, const double* __restrict__ freqs, int half) {
    extern __shared__ float smf[];
    int i = blockIdx.x, h0 = blockIdx.y * HG;
    long long pos = pos0 + i;
    long long lo = pos + 1 - swa;
    if (lo < 0) lo = 0;
    int nraw = (int)(pos - lo + 1);
    int nc = ratio ? (int)((pos + 1) / ratio) : 0;
    bool use_sel = sel && nc > topk;
    int ncomp = use_sel ? topk : nc;
    int ncand = nraw + ncomp;
    float* qs = smf;              // HG * d
    float* sc = smf + HG * d;     // HG * ncand
    __shared__ float hmax[HG], hden[HG];
    for (int k = threadIdx.x; k < HG * d; k += blockDim.x) qs[k] = q[((u64)i * nh + h0) * d + k];
    __syncthreads();
    int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
    float scale = rsqrtf((float)d);
    scale = 1.0f / sqrtf((float)d);
    for (int c = wid; c < ncand; c += nw) {
        const float* row;
        if (c < nraw) {
            long long p = lo + c;
            row = p >= pos0 ? kvb + (u64)(p - pos0) * d : ring + (u64)(p % swa) * d;
        } else {
            int r = c - nraw;
            if (use_sel) r = sel[(u64)i * topk + r];
            row = comp + (u64)r * d;
        }
        float part[HG];
#pragma unroll
        for (int h = 0; h < HG; h++) part[h] = 0.0f;
        for (int k = lane * 4; k < d; k += 128) {
            float4 rv = *(const float4*)(row + k);
#pragma unroll
            for (int h = 0; h < HG; h++) {
                float4 qv = *(const float4*)(qs + h * d + k);
                part[h] += qv.x * rv.x + qv.y * rv.y + qv.z * rv.z + qv.w * rv.w;
            }
        }
#pragma unroll
        for (int h = 0; h < HG; h++) {
            float s = warp_sum(part[h]);
            if (lane == 0) sc[h * ncand + c] = s * scale;
        }
    }
    __syncthreads();
    for (int h = wid; h < HG; h += nw) {
        float sink = sinks[h0 + h];
        float mx = sink;
        for (int c = lane; c < ncand; c += 32) mx = fmaxf(mx, sc[h * ncand + c]);
        mx = warp_max(mx);
        float den = 0.0f;
        for (int c = lane; c < ncand; c += 32) {
            float p = expf(sc[h * ncand + c] - mx);
            sc[h * ncand + c] = p;
            den += p;
        }
        den = warp_sum(den) + expf(sink - mx);
        if (lane == 0) { hmax[h] = mx; hden[h] = den; }
    }
    __syncthreads();
    // Weighted sum. One head (decode): warps split the candidates, partial sums reduced in shared memory.
    // Several heads: each thread owns 4 consecutive dims of one head and walks all candidates.
    int dq = d / 4;
    float* wred = sc + ((HG * ncand + 3) & ~3);  // HG == 1: nw * d floats, 16-byte aligned
    for (int u = threadIdx.x; u < (HG == 1 ? dq : dq * HG); u += blockDim.x) {
        int h = HG == 1 ? 0 : u / dq, k = (u % dq) * 4;
        float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
        float inv = 1.0f / hden[h];
        if (HG == 1) {
            break;
        }
        for (int c = 0; c < ncand; c++) {
            const float* row;
            if (c < nraw) {
                long long p = lo + c;
                row = p >= pos0 ? kvb + (u64)(p - pos0) * d : ring + (u64)(p % swa) * d;
            } else {
                int r = c - nraw;
                if (use_sel) r = sel[(u64)i * topk + r];
                row = comp + (u64)r * d;
            }
            float wgt = sc[h * ncand + c] * inv;
            float4 rv = *(const float4*)(row + k);
            acc.x += wgt * rv.x; acc.y += wgt * rv.y; acc.z += wgt * rv.z; acc.w += wgt * rv.w;
        }
        attn_store(acc, k, d, half, pos, freqs, o + ((u64)i * nh + h0 + h) * d);
    }
    if (HG == 1) {
        float4 acc[4];
#pragma unroll
        for (int q4 = 0; q4 < 4; q4++) acc[q4] = make_float4(0.f, 0.f, 0.f, 0.f);
        float inv = 1.0f / hden[0];
        for (int c = wid; c < ncand; c += nw) {
            const float* row;
            if (c < nraw) {
                long long p = lo + c;
                row = p >= pos0 ? kvb + (u64)(p - pos0) * d : ring + (u64)(p % swa) * d;
            } else {
                int r = c - nraw;
                if (use_sel) r = sel[(u64)i * topk + r];
                row = comp + (u64)r * d;
            }
            float wgt = sc[c] * inv;
#pragma unroll
            for (int q4 = 0; q4 < 4; q4++) {
                int k = lane * 4 + 128 * q4;
                if (k < d) {
                    float4 rv = *(const float4*)(row + k);
                    acc[q4].x += wgt * rv.x; acc[q4].y += wgt * rv.y; acc[q4].z += wgt * rv.z; acc[q4].w += wgt * rv.w;
                }
            }
        }
#pragma unroll
        for (int q4 = 0; q4 < 4; q4++) {
            int k = lane * 4 + 128 * q4;
            if (k < d) *(float4*)(wred + wid * d + k) = acc[q4];
        }
        __syncthreads();
        for (int u = threadIdx.x; u < dq; u += blockDim.x) {
            int k = u * 4;
            float4 a = make_float4(0.f, 0.f, 0.f, 0.f);
            for (int w = 0; w < nw; w++) {
                float4 v = *(const float4*)(wred + w * d + k);
                a.x += v.x; a.y += v.y; a.z += v.z; a.w += v.w;
            }
            attn_store(a, k, d, half, pos, freqs, o + ((u64)i * nh + h0) * d);
        }
    }
}
#define ATTN_ARGS const float* q, const float* kvb, const float* ring, const float* comp, const int* sel, const float* sinks, float* o, int nh, int d, \
    long long pos0, int swa, int ratio, int topk, const double* freqs, int half
#define ATTN_CALL q, kvb, ring, comp, sel, sinks, o, nh, d, pos0, swa, ratio, topk, freqs, half
extern "C" __global__ void __launch_bounds__(256) attn_h1(ATTN_ARGS) { PDL_ENTRY attn_impl<1>(ATTN_CALL); }
extern "C" __global__ void __launch_bounds__(256) attn_h4(ATTN_ARGS) { PDL_ENTRY attn_impl<4>(ATTN_CALL); }
extern "C" __global__ void __launch_bounds__(256) attn_h16(ATTN_ARGS) { PDL_ENTRY attn_impl<16>(ATTN_CALL); }

// Ring update: the last min(n, swa) batch rows into ring slots pos % swa.
extern "C" __global__ void ring_store(const float* kvb, float* ring, int n, int d, long long pos0, int swa, const long long* dpos) { PDL_ENTRY
    if (dpos) pos0 = *dpos;
    int i = blockIdx.x;
    if (i < n - swa) return;
    long long p = pos0 + i;
    for (int j = threadIdx.x; j < d; j += blockDim.x) ring[(u64)(p % swa) * d + j] = kvb[(u64)i * d + j];
}

