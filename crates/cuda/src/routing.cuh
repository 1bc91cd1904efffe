
// ---------------------------------------------------------------------------------------------
// Routing of one token (moe.cu's route and gate_route_dec).
// ---------------------------------------------------------------------------------------------
// Routing of token i by one block (>= n_expert threads, <= 1024); thread t < ne holds logit `lt` of
// expert t.
__device__ void route_token(float lt, int i, int ne, const float* bias, const int* hash, const u32* tokens, int k, int normalize, float scale,
                            int* eids, float* ew) {
    __shared__ int chosen[16];
    __shared__ float ps[1024];
    int t = threadIdx.x, lane = t & 31, wid = t >> 5;
    float p = t < ne ? sqrtf(softplusf_(lt)) : -INFINITY;
    if (t < ne) ps[t] = p;
    float selv = t < ne ? p + (bias ? bias[t] : 0.0f) : -INFINITY;
    if (hash) {
        if (t < k) chosen[t] = hash[(u64)tokens[i] * k + t];
    } else {
        // k rounds of an argmax (largest value, ties to the lowest index) by warp 0 alone: lane l holds
        // experts l, l + 32, .. (the first kept on ties within the lane), then one warp reduction a
        // round, no block barriers between rounds.
        __shared__ float sv[1024];
        sv[t] = selv;
        __syncthreads();
        if (wid == 0) {
            float v[32];
#pragma unroll
            for (int q = 0; q < 32; q++) v[q] = 32 * q < blockDim.x ? sv[lane + 32 * q] : -INFINITY;
            for (int slot = 0; slot < k; slot++) {
                float bv = v[0];
                int bi = lane < ne ? lane : 0x7fffffff;
#pragma unroll
                for (int q = 1; q < 32; q++) {
                    if (32 * q >= ne) break;
                    if (lane + 32 * q < ne && v[q] > bv) { bv = v[q]; bi = lane + 32 * q; }
                }
#pragma unroll
                for (int o = 16; o > 0; o >>= 1) {
                    float ov = __shfl_xor_sync(0xffffffffu, bv, o);
                    int oi = __shfl_xor_sync(0xffffffffu, bi, o);
                    if (ov > bv || (ov == bv && oi < bi)) { bv = ov; bi = oi; }
                }
                if (lane == 0) chosen[slot] = bi;
#pragma unroll
                for (int q = 0; q < 32; q++) {
                    if (32 * q >= ne) break;
                    if (lane + 32 * q == bi) v[q] = -INFINITY;
                }
            }
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

