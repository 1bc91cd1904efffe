// Quantized mat-vec with f32 activations (MV_ARGS etc. in matvec.cuh): one kernel per weight type.
template <int NT> __device__ void mv_q8_0(MV_ARGS) {
    int nb = cols >> 5;
    MV_PROLOGUE((u64)nb * 34)
    int p = lane & 3;
    for (int ib = (lane >> 2) + 8 * part; ib < nb; ib += 8 * ks) {
        const u8* b = wr + ib * 34;
        float d = h2f(ld16(b));
        u16 q01 = ld16(b + 2 + 8 * p), q23 = ld16(b + 4 + 8 * p), q45 = ld16(b + 6 + 8 * p), q67 = ld16(b + 8 + 8 * p);
        float w[8] = {(float)(signed char)(q01 & 255), (float)(signed char)(q01 >> 8), (float)(signed char)(q23 & 255), (float)(signed char)(q23 >> 8),
                      (float)(signed char)(q45 & 255), (float)(signed char)(q45 >> 8), (float)(signed char)(q67 & 255), (float)(signed char)(q67 >> 8)};
        int c = ib * 32 + 8 * p;
#pragma unroll
        for (int t = 0; t < NT; t++) {
            if (t < nt) {
                const float4* xv = (const float4*)(xs + (u64)t * ldx + c);
                float4 a = xv[0], bb = xv[1];
                float s = w[0] * a.x + w[1] * a.y + w[2] * a.z + w[3] * a.w + w[4] * bb.x + w[5] * bb.y + w[6] * bb.z + w[7] * bb.w;
                acc[t] += d * s;
            }
        }
    }
    MV_EPILOGUE
}

template <int NT> __device__ void mv_q2_k(MV_ARGS) {
    int nb = cols >> 8;
    MV_PROLOGUE((u64)nb * 84)
    int w = lane & 15, h = w >> 3, l0 = 4 * (w & 7), hi = (w & 7) >= 4;
    for (int ib = (lane >> 4) + 2 * part; ib < nb; ib += 2 * ks) {
        const u8* b = wr + ib * 84;
        u32 q = *(const u32*)(b + 16 + 4 * w);
        float d = h2f(ld16(b + 80)), dmin = h2f(ld16(b + 82));
        u32 sc4 = 0;
#pragma unroll
        for (int j = 0; j < 4; j++) sc4 |= (u32)b[8 * h + 2 * j + hi] << (8 * j);
#pragma unroll
        for (int t = 0; t < NT; t++) {
            if (t < nt) {
                const float* xt = xs + (u64)t * ldx + ib * 256 + 128 * h + l0;
                float s = 0.0f;
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    float4 xv = *(const float4*)(xt + 32 * j);
                    u32 sc = (sc4 >> (8 * j)) & 255;
                    float dl = d * (float)(sc & 15), ml = dmin * (float)(sc >> 4);
                    float v0 = (float)((q >> (2 * j)) & 3), v1 = (float)((q >> (8 + 2 * j)) & 3);
                    float v2 = (float)((q >> (16 + 2 * j)) & 3), v3 = (float)((q >> (24 + 2 * j)) & 3);
                    s += dl * (v0 * xv.x + v1 * xv.y + v2 * xv.z + v3 * xv.w) - ml * (xv.x + xv.y + xv.z + xv.w);
                }
                acc[t] += s;
            }
        }
    }
    MV_EPILOGUE
}

template <int NT> __device__ void mv_q4_k(MV_ARGS) {
    int nb = cols >> 8;
    MV_PROLOGUE((u64)nb * 144)
    int j = lane >> 3, l0 = 4 * (lane & 7);
    for (int ib = part; ib < nb; ib += ks) {
        const u8* b = wr + ib * 144;
        u32 q = *(const u32*)(b + 16 + 4 * lane);
        float d = h2f(ld16(b)), dmin = h2f(ld16(b + 2));
        int s0, m0, s1, m1;
        q4k_sm(2 * j, b + 4, &s0, &m0);
        q4k_sm(2 * j + 1, b + 4, &s1, &m1);
        float d0 = d * s0, dm0 = dmin * m0, d1 = d * s1, dm1 = dmin * m1;
#pragma unroll
        for (int t = 0; t < NT; t++) {
            if (t < nt) {
                const float* xt = xs + (u64)t * ldx + ib * 256 + 64 * j + l0;
                float4 xa = *(const float4*)xt, xb = *(const float4*)(xt + 32);
                float lo = (float)(q & 15) * xa.x + (float)((q >> 8) & 15) * xa.y + (float)((q >> 16) & 15) * xa.z + (float)((q >> 24) & 15) * xa.w;
                float hv = (float)((q >> 4) & 15) * xb.x + (float)((q >> 12) & 15) * xb.y + (float)((q >> 20) & 15) * xb.z + (float)((q >> 28) & 15) * xb.w;
                acc[t] += d0 * lo - dm0 * (xa.x + xa.y + xa.z + xa.w) + d1 * hv - dm1 * (xb.x + xb.y + xb.z + xb.w);
            }
        }
    }
    MV_EPILOGUE
}


template <int NT> __device__ void mv_iq2_xxs(MV_ARGS, const u64* grid) {
    int nb = cols >> 8;
    MV_PROLOGUE((u64)nb * 66)
    int g = lane & 7;
    for (int ib = (lane >> 3) + 4 * part; ib < nb; ib += 4 * ks) {
        const u8* b = wr + ib * 66;
        float d = h2f(ld16(b));
        u32 a0 = ld32u(b + 2 + 8 * g), a1 = ld32u(b + 6 + 8 * g);
        float db = d * (0.5f + (float)(a1 >> 28)) * 0.25f;
        float part[NT];
#pragma unroll
        for (int t = 0; t < NT; t++) part[t] = 0.0f;
#pragma unroll
        for (int l = 0; l < 4; l++) {
            u64 gv = grid[(a0 >> (8 * l)) & 255];
            u32 sg = ksign((a1 >> (7 * l)) & 127);
            float w[8];
#pragma unroll
            for (int k = 0; k < 8; k++) {
                float v = (float)((gv >> (8 * k)) & 255);
                w[k] = (sg >> k) & 1 ? -v : v;
            }
#pragma unroll
            for (int t = 0; t < NT; t++) {
                if (t < nt) {
                    const float4* xv = (const float4*)(xs + (u64)t * ldx + ib * 256 + 32 * g + 8 * l);
                    float4 xa = xv[0], xb = xv[1];
                    part[t] += w[0] * xa.x + w[1] * xa.y + w[2] * xa.z + w[3] * xa.w + w[4] * xb.x + w[5] * xb.y + w[6] * xb.z + w[7] * xb.w;
                }
            }
        }
#pragma unroll
        for (int t = 0; t < NT; t++) acc[t] += db * part[t];
    }
    MV_EPILOGUE
}

template <int NT> __device__ void mv_f16(MV_ARGS) {
    MV_PROLOGUE((u64)cols * 2)
    for (int c = (part * 32 + lane) * 8; c < cols; c += 256 * ks) {
        uint4 raw = *(const uint4*)(wr + 2 * (u64)c);
        float w[8] = {h2f(raw.x & 0xffff), h2f(raw.x >> 16), h2f(raw.y & 0xffff), h2f(raw.y >> 16),
                      h2f(raw.z & 0xffff), h2f(raw.z >> 16), h2f(raw.w & 0xffff), h2f(raw.w >> 16)};
#pragma unroll
        for (int t = 0; t < NT; t++) {
            if (t < nt) {
                const float4* xv = (const float4*)(xs + (u64)t * ldx + c);
                float4 a = xv[0], bb = xv[1];
                acc[t] += w[0] * a.x + w[1] * a.y + w[2] * a.z + w[3] * a.w + w[4] * bb.x + w[5] * bb.y + w[6] * bb.z + w[7] * bb.w;
            }
        }
    }
    MV_EPILOGUE
}

template <int NT> __device__ void mv_bf16(MV_ARGS) {
    MV_PROLOGUE((u64)cols * 2)
    for (int c = (part * 32 + lane) * 2; c < cols; c += 64 * ks) {
        u32 raw = *(const u32*)(wr + 2 * (u64)c);
        float w0 = bf2f(raw & 0xffff), w1 = bf2f(raw >> 16);
#pragma unroll
        for (int t = 0; t < NT; t++)
            if (t < nt) acc[t] += w0 * xs[(u64)t * ldx + c] + w1 * xs[(u64)t * ldx + c + 1];
    }
    MV_EPILOGUE
}

template <int NT> __device__ void mv_f32(MV_ARGS) {
    MV_PROLOGUE((u64)cols * 4)
    const float* wf = (const float*)wr;
    for (int c = part * 32 + lane; c < cols; c += 32 * ks) {
        float w0 = wf[c];
#pragma unroll
        for (int t = 0; t < NT; t++)
            if (t < nt) acc[t] += w0 * xs[(u64)t * ldx + c];
    }
    MV_EPILOGUE
}

#define MV_KERNEL(NAME, NT) \
    extern "C" __global__ void __launch_bounds__(256) NAME##_n##NT(MV_ARGS) { PDL_ENTRY NAME<NT>(MV_CALL); }
MV_KERNEL(mv_q8_0, 1) MV_KERNEL(mv_q8_0, 4)
MV_KERNEL(mv_q2_k, 1) MV_KERNEL(mv_q2_k, 4)
MV_KERNEL(mv_q4_k, 1) MV_KERNEL(mv_q4_k, 4)
MV_KERNEL(mv_f16, 1) MV_KERNEL(mv_f16, 4)
MV_KERNEL(mv_bf16, 1) MV_KERNEL(mv_bf16, 4)
MV_KERNEL(mv_f32, 1) MV_KERNEL(mv_f32, 4)
#define MV_IQ2(NT) \
    extern "C" __global__ void __launch_bounds__(256) mv_iq2_xxs_n##NT(MV_ARGS) { PDL_ENTRY \
        __shared__ u64 grid[256]; \
        for (int i = threadIdx.x; i < 256; i += blockDim.x) grid[i] = iq2xxs_grid[i]; \
        __syncthreads(); \
        mv_iq2_xxs<NT>(MV_CALL, grid); \
    }
MV_IQ2(1) MV_IQ2(4)

