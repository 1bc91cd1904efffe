// Embedding rows (F16 / F32 / BF16 / Q8_0 tables) broadcast into the n_hc streams.
extern "C" __global__ void embed(const u8* table, int ty, const u32* tokens, float* x, int e, int n_hc) { PDL_ENTRY
    // Grid (tokens, column slices): one value per thread and pass (a single block per token waited
    // for e / blockDim dependent row reads).
    int i = blockIdx.x;
    u64 t = tokens[i];
    for (int j = blockIdx.y * blockDim.x + threadIdx.x; j < e; j += gridDim.y * blockDim.x) {
        float v;
        if (ty == 1) v = h2f(((const u16*)table)[t * e + j]);
        else if (ty == 30) v = bf2f(((const u16*)table)[t * e + j]);
        else if (ty == 8) {
            const u8* b = table + t * (e / 32) * 34 + (j / 32) * 34;
            v = h2f(ld16(b)) * (float)(signed char)b[2 + (j & 31)];
        } else v = ((const float*)table)[t * e + j];
        for (int s = 0; s < n_hc; s++) x[(u64)i * n_hc * e + s * e + j] = v;
    }
}

// ---------------------------------------------------------------------------------------------
// Norms, rope, QAT simulation.
// ---------------------------------------------------------------------------------------------
// RMS norm of rows of `d` (in -> out, may alias), optional weight. Sum of squares in double like the CPU.
// With q80: also the Q8_0 copy of each output row (row r at q80 + r*d; d % 32 == 0).
extern "C" __global__ void rms_rows(const float* in, int ldi, float* out, int ldo, int d, const float* w, float eps, signed char* q80, float* d80) { PDL_ENTRY
    __shared__ double red[32];
    const float* x = in + (u64)blockIdx.x * ldi;
    float* y = out + (u64)blockIdx.x * ldo;
    // The first pass's weight is requested before the reduction (it would wait after it).
    float w0 = w && threadIdx.x < d ? w[threadIdx.x] : 1.0f;
    double ss = block_sum_d(sumsq_part(x, d), red);
    float inv = 1.0f / sqrtf((float)(ss / d) + eps);
    if (!q80) {
        for (int j = threadIdx.x; j < d; j += blockDim.x) y[j] = w ? x[j] * inv * (j == threadIdx.x ? w0 : w[j]) : x[j] * inv;
        return;
    }
    for (int j0 = 0; j0 < d; j0 += blockDim.x) {
        int j = j0 + threadIdx.x;
        if (j >= d) break;  // whole warps (d % 32 == 0)
        float v = w ? x[j] * inv * (j0 == 0 ? w0 : w[j]) : x[j] * inv;
        y[j] = v;
        q80_warp(v, (u64)blockIdx.x * d + j, q80, d80);
    }
}

__device__ float pow2_ceil(float x) {
    u32 bits = __float_as_uint(x);
    int ex = (bits >> 23) & 0xff;
    u32 mant = bits & 0x7fffff;
    if (ex == 0) {
        int e = -149 + (32 - __clz(mant));
        int p = (mant & (mant - 1)) == 0 ? e - 1 : e;
        return ldexpf(1.0f, p);
    }
    int e = ex - 127;
    return ldexpf(1.0f, mant == 0 ? e : e + 1);
}
__device__ float e4m3_round(float v) {
    float a = fabsf(v);
    if (a == 0.0f || !isfinite(a)) return v;
    a = fminf(a, 448.0f);
    int e = (int)((__float_as_uint(a) >> 23) & 0xff) - 127;
    float step = e < -6 ? ldexpf(1.0f, -9) : ldexpf(1.0f, e - 3);
    float r = fminf(rintf(a / step) * step, 448.0f);
    return copysignf(r, v);
}
__device__ float e2m1_round(float v) {
    float a = fminf(fabsf(v), 6.0f), r;
    if (a < 2.0f) r = rintf(a * 2.0f) * 0.5f;
    else if (a < 4.0f) r = rintf(a);
    else r = a <= 5.0f ? 4.0f : 6.0f;
    return copysignf(r, v);
}
__device__ void fp8_block(float* b, int n) {
    float amax = 0.0f;
    for (int i = 0; i < n; i++) amax = fmaxf(amax, fabsf(b[i]));
    amax = fmaxf(amax, 1e-4f);
    float s = pow2_ceil(amax / 448.0f);
    for (int i = 0; i < n; i++) b[i] = e4m3_round(fminf(fmaxf(b[i] / s, -448.0f), 448.0f)) * s;
}
__device__ void fp4_block(float* b, int n) {
    float amax = 0.0f;
    for (int i = 0; i < n; i++) amax = fmaxf(amax, fabsf(b[i]));
    amax = fmaxf(amax, 6.0f * 1.17549435e-38f);
    float s = pow2_ceil(amax / 6.0f);
    for (int i = 0; i < n; i++) b[i] = e2m1_round(fminf(fmaxf(b[i] / s, -6.0f), 6.0f)) * s;
}

// Rows of `d`: optional RMS norm (weight w may be null), rope on the tail at
// pos = pos_base + (row / pos_div) * pos_mul, then QAT: 1 = FP8 (64-blocks) on the non-rope part,
// 2 = Hadamard + FP4 (32-blocks) on the whole row. Row r goes to out + r*ldo. One block per row,
// blockDim.x == d (<= 1024).
extern "C" __global__ void norm_rope_qat(const float* in, int ldi, float* out, int ldo, int d, int do_norm, const float* w, float eps,
                                         const double* freqs, int half, long long pos_base, int pos_div, int pos_mul, int qat,
                                         const long long* dpos, int comp_ratio) { PDL_ENTRY
    // Decode (graph-replayable): the position comes from device memory. With comp_ratio > 0, row r is
    // the compressor window that closes at position dpos[r] (nothing to do when none closes there), and
    // goes to its compressed row.
    u64 orow = blockIdx.x;
    if (dpos && comp_ratio < 0) {
        // A batched step: `dpos` holds the position of each group of pos_div rows (one per session).
        pos_base = dpos[blockIdx.x / pos_div];
        pos_mul = 0;
    } else if (dpos && comp_ratio) {
        long long p = dpos[blockIdx.x];
        if ((p + 1) % comp_ratio) return;
        orow = (u64)(p / comp_ratio);
        pos_base = (p / comp_ratio) * comp_ratio;
        pos_mul = 0;
    } else if (dpos) {
        pos_base = *dpos;
    }
    extern __shared__ double sm[];  // d doubles (+32 for reduction)
    double* red = sm + d;
    float* rowf = (float*)(red + 32);  // d floats
    int r = blockIdx.x, j = threadIdx.x;
    float v = in[(u64)r * ldi + j];
    // Loads that do not depend on the reduction are issued before it.
    float wj = do_norm && w ? w[j] : 1.0f;
    int tail0r = d - 2 * half;
    double fq = j >= tail0r && ((j - tail0r) & 1) == 0 ? freqs[(j - tail0r) >> 1] : 0.0;
    if (do_norm) {
        double ss = block_sum_d((double)v * (double)v, red);
        float inv = 1.0f / sqrtf((float)(ss / d) + eps);
        v = w ? v * inv * wj : v * inv;
    }
    rowf[j] = v;
    __syncthreads();
    long long pos = pos_base + (long long)(r / pos_div) * pos_mul;
    int tail0 = d - 2 * half;
    if (j >= tail0 && ((j - tail0) & 1) == 0) {
        double ang = (double)pos * fq;
        double s, c;
        sincos(ang, &s, &c);
        float sf = (float)s, cf = (float)c;
        float x0 = rowf[j], x1 = rowf[j + 1];
        rowf[j] = x0 * cf - x1 * sf;
        rowf[j + 1] = x0 * sf + x1 * cf;
    }
    __syncthreads();
    if (qat == 1) {
        int nope = d - 2 * half;
        int nb = (nope + 63) / 64;
        // Warp w quantises block w (two values per lane) instead of one thread walking 64 serially.
        int lane = j & 31, wq = j >> 5;
        for (int b = wq; b < nb; b += blockDim.x >> 5) {
            int len = min(64, nope - 64 * b);
            float* blk = rowf + 64 * b;
            float v0 = lane < len ? blk[lane] : 0.0f, v1 = lane + 32 < len ? blk[lane + 32] : 0.0f;
            float amax = fmaxf(warp_max(fmaxf(fabsf(v0), fabsf(v1))), 1e-4f);
            float sc = pow2_ceil(amax / 448.0f);
            if (lane < len) blk[lane] = e4m3_round(fminf(fmaxf(v0 / sc, -448.0f), 448.0f)) * sc;
            if (lane + 32 < len) blk[lane + 32] = e4m3_round(fminf(fmaxf(v1 / sc, -448.0f), 448.0f)) * sc;
        }
        __syncthreads();
    } else if (qat == 2) {
        sm[j] = (double)rowf[j];
        __syncthreads();
        for (int h = 1; h < d; h <<= 1) {
            double a = sm[j], bpart = sm[j ^ h];
            __syncthreads();
            sm[j] = (j & h) ? bpart - a : a + bpart;
            __syncthreads();
        }
        rowf[j] = (float)(sm[j] * (1.0 / sqrt((double)d)));
        __syncthreads();
        {
            int lane = j & 31, wq = j >> 5;
            for (int b = wq; b < d / 32; b += blockDim.x >> 5) {
                float v = rowf[32 * b + lane];
                float amax = fmaxf(warp_max(fabsf(v)), 6.0f * 1.17549435e-38f);
                float sc = pow2_ceil(amax / 6.0f);
                rowf[32 * b + lane] = e2m1_round(fminf(fmaxf(v / sc, -6.0f), 6.0f)) * sc;
            }
        }
        __syncthreads();
    }
    out[orow * ldo + j] = rowf[j];
}

