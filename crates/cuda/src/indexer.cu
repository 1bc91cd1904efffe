// ---------------------------------------------------------------------------------------------
// Indexer: scores[i][c] = sum_h w[i][h] * relu(q[i][h] . k[c]) for tokens with nc > topk.
// Grid (ceil(maxc/8), n), 256 threads: warp w scores compressed row 8*blockIdx.x + w; lane l takes
// heads l, l+32, .. (up to 256 heads), each dot product summed over k in order, then the heads of
// each 32-group by a warp sum and the groups in order. (One warp per row: the former 16 rows per
// block walked 128-long dot products four times over per lane: ~22 us at 1024 rows.)
// ---------------------------------------------------------------------------------------------
extern "C" __global__ void __launch_bounds__(256) idx_scores(const float* __restrict__ q, const float* __restrict__ wts, const float* __restrict__ keys,
                                                             float* __restrict__ scores, int ldsc, long long pos0, int ratio, int topk, int H, int D,
                                                             const long long* dpos) { PDL_ENTRY
    if (dpos) pos0 = *dpos;
    extern __shared__ float sm2[];
    int i = blockIdx.y;
    long long pos = pos0 + i;
    int nc = (int)((pos + 1) / ratio);
    if (nc <= topk) return;
    int r0 = blockIdx.x * 8;
    if (r0 >= nc) return;
    float* qs = sm2;                  // H * (D+1): padded rows, conflict-free per-lane head reads
    float* ks = sm2 + H * (D + 1);    // 8 * D: the block's key rows
    const float* qi = q + (u64)i * H * D;
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, r = r0 + w;
    // Stage q with all of a thread's loads in flight at once (16-byte loads when D allows).
    const int HD = H * D;
    if ((D & 3) == 0) {
        for (int k0 = threadIdx.x; k0 < HD / 4; k0 += 8 * blockDim.x) {
            float4 v[8];
#pragma unroll
            for (int u = 0; u < 8; u++) {
                int k = k0 + u * blockDim.x;
                v[u] = k < HD / 4 ? ((const float4*)qi)[k] : make_float4(0.f, 0.f, 0.f, 0.f);
            }
#pragma unroll
            for (int u = 0; u < 8; u++) {
                int k = 4 * (k0 + u * blockDim.x);
                if (k < HD) {
                    float* dst = qs + (k / D) * (D + 1) + k % D;
                    dst[0] = v[u].x; dst[1] = v[u].y; dst[2] = v[u].z; dst[3] = v[u].w;
                }
            }
        }
    } else
    for (int k0 = threadIdx.x; k0 < HD; k0 += 8 * blockDim.x) {
        float v[8];
#pragma unroll
        for (int u = 0; u < 8; u++) {
            int k = k0 + u * blockDim.x;
            v[u] = k < HD ? qi[k] : 0.0f;
        }
#pragma unroll
        for (int u = 0; u < 8; u++) {
            int k = k0 + u * blockDim.x;
            if (k < HD) qs[(k / D) * (D + 1) + k % D] = v[u];
        }
    }
    for (int k = lane; k < D; k += 32) ks[w * D + k] = r < nc ? keys[(u64)r * D + k] : 0.0f;
    __syncthreads();
    if (r >= nc) return;
    int HB = (H + 31) / 32;
    float dd[8];
#pragma unroll
    for (int hb = 0; hb < 8; hb++) dd[hb] = 0.0f;
    const float* kr = ks + w * D;
    for (int k = 0; k < D; k++) {
        float kv = kr[k];
#pragma unroll
        for (int hb = 0; hb < 8; hb++) {
            int h = hb * 32 + lane;
            if (hb < HB && h < H) dd[hb] += qs[h * (D + 1) + k] * kv;
        }
    }
    float tot = 0.0f;
#pragma unroll
    for (int hb = 0; hb < 8; hb++) {
        if (hb >= HB) break;
        int h = hb * 32 + lane;
        float sv = h < H && dd[hb] > 0.0f ? wts[(u64)i * H + h] * dd[hb] : 0.0f;
        tot += warp_sum(sv);
    }
    if (lane == 0) scores[(u64)i * ldsc + r] = tot;
}

__device__ __forceinline__ u32 fkey(float f) {
    u32 u = __float_as_uint(f);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// Top-k (largest scores, ties to the lowest index), output in ascending index order.
// One block of 1024 threads per token with nc > topk.
extern "C" __global__ void __launch_bounds__(1024) idx_topk(const float* scores, int ldsc, int* sel, long long pos0, int ratio, int topk, const long long* dpos) { PDL_ENTRY
    if (dpos) pos0 = *dpos;
    __shared__ u32 hist[256];
    __shared__ u32 s_prefix, s_need;
    __shared__ u32 cnt_gt[1024], cnt_eq[1024];
    int i = blockIdx.x;
    long long pos = pos0 + i;
    int nc = (int)((pos + 1) / ratio);
    if (nc <= topk) return;
    const float* s = scores + (u64)i * ldsc;
    int t = threadIdx.x;
    u32 prefix = 0, need = topk;  // find the key of the need-th largest among keys matching prefix
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int b = t; b < 256; b += blockDim.x) hist[b] = 0;
        __syncthreads();
        u32 mask_hi = shift == 24 ? 0u : (0xffffffffu << (shift + 8));
        for (int c = t; c < nc; c += blockDim.x) {
            u32 key = fkey(s[c]);
            if ((key & mask_hi) == (prefix & mask_hi)) atomicAdd(&hist[(key >> shift) & 255], 1u);
        }
        __syncthreads();
        if (t < 32) {
            // Warp 0 finds the bucket holding the need-th largest key: lane L owns buckets 255-8L ..
            // 248-8L (descending); an inclusive scan of the lane totals gives the count above each
            // lane, then the lane whose range crosses `need` walks its 8 buckets (a serial walk of all
            // 256 by one thread cost ~4 us a pass).
            u32 hv[8], tot = 0;
#pragma unroll
            for (int q = 0; q < 8; q++) { hv[q] = hist[255 - 8 * t - q]; tot += hv[q]; }
            u32 inc = tot;
#pragma unroll
            for (int o = 1; o < 32; o <<= 1) {
                u32 a = __shfl_up_sync(0xffffffffu, inc, o);
                if (t >= o) inc += a;
            }
            u32 before = inc - tot;
            bool here = before < need && inc >= need;
            if (here) {
                u32 acc = before;
                int q = 0;
                for (; q < 7; q++) {
                    if (acc + hv[q] >= need) break;
                    acc += hv[q];
                }
                s_prefix = prefix | ((u32)(255 - 8 * t - q) << shift);
                s_need = need - acc;
            }
        }
        __syncthreads();
        prefix = s_prefix;
        need = s_need;
        __syncthreads();
    }
    // prefix = threshold key T; need = how many keys == T to take (lowest indices first).
    int per = (nc + blockDim.x - 1) / blockDim.x;
    int c0 = t * per, c1 = min(nc, c0 + per);
    u32 g = 0, e = 0;
    for (int c = c0; c < c1; c++) {
        u32 key = fkey(s[c]);
        g += key > prefix;
        e += key == prefix;
    }
    // Exclusive prefix sums of (g, e) over threads: warp scans, then a scan of the warp totals.
    int lane = t & 31, wid = t >> 5;
    u32 ig = g, ie = e;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        u32 a = __shfl_up_sync(0xffffffffu, ig, o), b = __shfl_up_sync(0xffffffffu, ie, o);
        if (lane >= o) { ig += a; ie += b; }
    }
    if (lane == 31) { cnt_gt[wid] = ig; cnt_eq[wid] = ie; }
    __syncthreads();
    if (wid == 0) {
        int nw = blockDim.x >> 5;
        u32 wg = lane < nw ? cnt_gt[lane] : 0, we = lane < nw ? cnt_eq[lane] : 0;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            u32 a = __shfl_up_sync(0xffffffffu, wg, o), b = __shfl_up_sync(0xffffffffu, we, o);
            if (lane >= o) { wg += a; we += b; }
        }
        if (lane < nw) { cnt_gt[32 + lane] = wg; cnt_eq[32 + lane] = we; }
    }
    __syncthreads();
    u32 gb = ig - g + (wid > 0 ? cnt_gt[32 + wid - 1] : 0);
    u32 eq_before = ie - e + (wid > 0 ? cnt_eq[32 + wid - 1] : 0);
    // Output position = (number of selected indices before c).
    u32 sel_before = gb + min(eq_before, need);
    for (int c = c0; c < c1; c++) {
        u32 key = fkey(s[c]);
        bool take = key > prefix || (key == prefix && eq_before < need);
        if (key == prefix) eq_before++;
        if (take) sel[(u64)i * topk + sel_before++] = c;
    }
}

