
// ---------------------------------------------------------------------------------------------
// Routing of one token (shared by moe.cu's route and the fused decode entry in hc_decode.cu).
// ---------------------------------------------------------------------------------------------
// Routing of token i by one block (>= n_expert threads, <= 1024); thread t < ne holds logit `lt` of
// expert t.
__device__ void route_token(float lt, int i, int ne, const float* bias, const int* hash, const u32* tokens, int k, int normalize, float scale,
                            int* eids, float* ew) {
    __shared__ float wv[32];
    __shared__ int wi[32];
    __shared__ int chosen[16];
    __shared__ float ps[1024];
    int t = threadIdx.x, lane = t & 31, wid = t >> 5, nw = blockDim.x >> 5;
    float p = t < ne ? sqrtf(softplusf_(lt)) : -INFINITY;
    if (t < ne) ps[t] = p;
    float selv = t < ne ? p + (bias ? bias[t] : 0.0f) : -INFINITY;
    if (hash) {
        if (t < k) chosen[t] = hash[(u64)tokens[i] * k + t];
    } else {
        // k rounds of a block argmax (largest value, ties to the lowest index): warp shuffles, then warp 0.
        for (int slot = 0; slot < k; slot++) {
            float bv = selv;
            int bi = t < ne ? t : 0x7fffffff;
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) {
                float ov = __shfl_xor_sync(0xffffffffu, bv, o);
                int oi = __shfl_xor_sync(0xffffffffu, bi, o);
                if (ov > bv || (ov == bv && oi < bi)) { bv = ov; bi = oi; }
            }
            if (lane == 0) { wv[wid] = bv; wi[wid] = bi; }
            __syncthreads();
            if (wid == 0) {
                bv = lane < nw ? wv[lane] : -INFINITY;
                bi = lane < nw ? wi[lane] : 0x7fffffff;
#pragma unroll
                for (int o = 16; o > 0; o >>= 1) {
                    float ov = __shfl_xor_sync(0xffffffffu, bv, o);
                    int oi = __shfl_xor_sync(0xffffffffu, bi, o);
                    if (ov > bv || (ov == bv && oi < bi)) { bv = ov; bi = oi; }
                }
                if (lane == 0) chosen[slot] = bi;
            }
            __syncthreads();
            if (t == chosen[slot]) selv = -INFINITY;
        }
    }
    __syncthreads();
    if (t == 0) {
        float w[16], sum = 0.0f;
        for (int s = 0; s < k; s++) {
            w[s] = ps[chosen[s]];
            sum += w[s];
        }
        float den = normalize ? fmaxf(sum, 6.1035156e-5f) : 1.0f;
        for (int s = 0; s < k; s++) {
            eids[(u64)i * k + s] = chosen[s];
            ew[(u64)i * k + s] = w[s] / den * scale;
        }
    }
}

