
// Greedy pick of one row: the argmax (largest value, ties to the lowest index, NaN never wins; all
// NaN: 0) and its log-probability under the row's softmax (NaN and -inf entries add nothing). Over
// the grid: block b takes a grid-stride share, keeps per thread a running max and the sum of
// exp(x - max) (rescaled when the max grows), and publishes its best as (value, index, sum) at
// out[3 + b], out[3 + B + b], out[3 + 2B + b]; the last block to finish (ticket out[2], reset for the
// next launch) reduces the B parts: out[0] = index, out[1] = log-probability (float bits).
// 256 threads, B <= 1024; out holds 3 + 3B ints, out[2] zero before the first launch.
__device__ __forceinline__ void argmax_pick(float& bv, int& bi, float ov, int oi) {
    if (ov > bv || (ov == bv && oi < bi)) { bv = ov; bi = oi; }
}
// Merges a (max, sum of exp(x - max)) pair into another; an empty part has max -inf and sum 0.
__device__ __forceinline__ void lse_merge(float& m, float& s, float om, float os) {
    float M = fmaxf(m, om);
    if (M == -INFINITY) return;
    s = (m == -INFINITY ? 0.f : s * expf(m - M)) + (om == -INFINITY ? 0.f : os * expf(om - M));
    m = M;
}
__device__ __forceinline__ void argmax_warp(float& bv, int& bi, float& s) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        float ov = __shfl_xor_sync(0xffffffffu, bv, o), os = __shfl_xor_sync(0xffffffffu, s, o);
        int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        float m = bv;
        lse_merge(m, s, ov, os);
        argmax_pick(bv, bi, ov, oi);
    }
}
extern "C" __global__ void __launch_bounds__(256) argmax_row(const float* __restrict__ x, int n, int* out) { PDL_ENTRY
    __shared__ float sv[8], ss[8];
    __shared__ int si[8];
    __shared__ int last;
    int t = threadIdx.x, lane = t & 31, wid = t >> 5, B = gridDim.x, b = blockIdx.x;
    float best = -INFINITY, sum = 0.f;
    int bi = 0x7fffffff;
#pragma unroll 4
    for (int j = b * 256 + t; j < n; j += B * 256) {
        float v = x[j];
        if (v > best) {
            sum = (best == -INFINITY ? 0.f : sum * expf(best - v)) + 1.f;
        } else if (v > -INFINITY) {
            sum += expf(v - best);
        }
        argmax_pick(best, bi, v, j);
    }
    argmax_warp(best, bi, sum);
    if (lane == 0) { sv[wid] = best; si[wid] = bi; ss[wid] = sum; }
    __syncthreads();
    if (t == 0) {
        for (int w = 1; w < 8; w++) {
            float m = best;
            lse_merge(m, sum, sv[w], ss[w]);
            argmax_pick(best, bi, sv[w], si[w]);
        }
        ((float*)out)[3 + b] = best;
        out[3 + B + b] = bi;
        ((float*)out)[3 + 2 * B + b] = sum;
        __threadfence();
        int k = atomicAdd(out + 2, 1);
        last = k == B - 1;
        if (last) out[2] = 0;
    }
    __syncthreads();
    if (!last || wid != 0) return;
    __threadfence();
    best = -INFINITY;
    sum = 0.f;
    bi = 0x7fffffff;
    for (int q = lane; q < B; q += 32) {
        float qv = __ldcg((const float*)out + 3 + q), qs = __ldcg((const float*)out + 3 + 2 * B + q);
        float m = best;
        lse_merge(m, sum, qv, qs);
        argmax_pick(best, bi, qv, __ldcg(out + 3 + B + q));
    }
    argmax_warp(best, bi, sum);
    if (lane == 0) {
        out[0] = bi == 0x7fffffff ? 0 : bi;
        // log p(best) = best - (best + log(sum of exp(x - best))).
        ((float*)out)[1] = -logf(sum);
    }
}

