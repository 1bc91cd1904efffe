// ---------------------------------------------------------------------------------------------
// Dequantization to f16 (input of cuBLAS GEMMs in prefill). `n` elements (whole blocks); one
// thread per 32-element unit.
// ---------------------------------------------------------------------------------------------
extern "C" __global__ void dq_q8_0(const u8* W, u16* out, u64 n) { PDL_ENTRY
    u64 u = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (u * 32 >= n) return;
    const u8* b = W + u * 34;
    float d = h2f(ld16(b));
    for (int k = 0; k < 32; k++) out[u * 32 + k] = f2h(d * (float)(signed char)b[2 + k]);
}
extern "C" __global__ void dq_q2_k(const u8* W, u16* out, u64 n) { PDL_ENTRY
    u64 u = (u64)blockIdx.x * blockDim.x + threadIdx.x;  // unit = (block, h, j, l8) -> 8 elements, one 16-byte store
    if (u * 8 >= n) return;
    u64 ib = u >> 5;
    int h = (u >> 4) & 1, j = (u >> 2) & 3, l0 = (u & 3) * 8;
    const u8* b = W + ib * 84;
    float d = h2f(ld16(b + 80)), dmin = h2f(ld16(b + 82));
    int sc = b[8 * h + 2 * j + (l0 >= 16)];
    float dl = d * (float)(sc & 15), ml = dmin * (float)(sc >> 4);
    u32 q0 = ld32u(b + 16 + 32 * h + l0), q1 = ld32u(b + 20 + 32 * h + l0);
    u32 o[4];
    for (int t = 0; t < 4; t++) {
        u32 qq = t < 2 ? q0 : q1;
        int s0 = (t & 1) * 16;
        float v0 = (float)((qq >> (s0 + 2 * j)) & 3), v1 = (float)((qq >> (s0 + 8 + 2 * j)) & 3);
        o[t] = (u32)f2h(dl * v0 - ml) | ((u32)f2h(dl * v1 - ml) << 16);
    }
    *(uint4*)(out + ib * 256 + 128 * h + 32 * j + l0) = make_uint4(o[0], o[1], o[2], o[3]);
}
extern "C" __global__ void dq_q4_k(const u8* W, u16* out, u64 n) { PDL_ENTRY
    u64 u = (u64)blockIdx.x * blockDim.x + threadIdx.x;  // unit = (block, j, half)
    if (u * 32 >= n) return;
    u64 ib = u >> 3;
    int j = (u >> 1) & 3, hf = u & 1;
    const u8* b = W + ib * 144;
    float d = h2f(ld16(b)), dmin = h2f(ld16(b + 2));
    int sc, m;
    q4k_sm(2 * j + hf, b + 4, &sc, &m);
    u16* o = out + ib * 256 + 64 * j + 32 * hf;
    for (int l = 0; l < 32; l++) {
        int q = b[16 + 32 * j + l];
        q = hf ? (q >> 4) : (q & 15);
        o[l] = f2h(d * sc * (float)q - dmin * m);
    }
}
extern "C" __global__ void dq_iq2_xxs(const u8* W, u16* out, u64 n) { PDL_ENTRY
    u64 u = (u64)blockIdx.x * blockDim.x + threadIdx.x;  // unit = (block, group, l) -> 8 elements, one 16-byte store
    if (u * 8 >= n) return;
    u64 ib = u >> 5;
    int g = (u >> 2) & 7, l = u & 3;
    const u8* b = W + ib * 66;
    float d = h2f(ld16(b));
    u32 a0 = ld32u(b + 2 + 8 * g), a1 = ld32u(b + 6 + 8 * g);
    float db = d * (0.5f + (float)(a1 >> 28)) * 0.25f;
    u64 gv = iq2xxs_grid[(a0 >> (8 * l)) & 255];
    u32 sg = ksign((a1 >> (7 * l)) & 127);
    u32 o[4];
    for (int k = 0; k < 8; k += 2) {
        float v0 = db * (float)((gv >> (8 * k)) & 255), v1 = db * (float)((gv >> (8 * k + 8)) & 255);
        if ((sg >> k) & 1) v0 = -v0;
        if ((sg >> (k + 1)) & 1) v1 = -v1;
        o[k / 2] = (u32)f2h(v0) | ((u32)f2h(v1) << 16);
    }
    *(uint4*)(out + ib * 256 + 32 * g + 8 * l) = make_uint4(o[0], o[1], o[2], o[3]);
}
extern "C" __global__ void dq_bf16(const u8* W, u16* out, u64 n) { PDL_ENTRY
    u64 u = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (u * 32 >= n) return;
    const u16* s = (const u16*)W;
    for (int k = 0; k < 32; k++) out[u * 32 + k] = f2h(bf2f(s[u * 32 + k]));
}
extern "C" __global__ void dq_f32(const u8* W, u16* out, u64 n) { PDL_ENTRY
    u64 u = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (u * 32 >= n) return;
    const float* s = (const float*)W;
    for (int k = 0; k < 32; k++) out[u * 32 + k] = f2h(s[u * 32 + k]);
}

// f32 (rows with stride ld) -> compact f16 rows of `cols`.
// Four elements per thread (x 16-byte aligned, ld and cols multiples of 4).
extern "C" __global__ void f32_to_f16_v4(const float* x, int ld, u16* out, int rows, int cols) { PDL_ENTRY
    u64 u = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    int cq = cols >> 2;
    if (u >= (u64)rows * cq) return;
    u64 r = u / cq, c = (u % cq) * 4;
    float4 v = *(const float4*)(x + r * ld + c);
    *(uint2*)(out + r * cols + c) = make_uint2((u32)f2h(v.x) | ((u32)f2h(v.y) << 16), (u32)f2h(v.z) | ((u32)f2h(v.w) << 16));
}
extern "C" __global__ void f32_to_f16(const float* x, int ld, u16* out, int rows, int cols) { PDL_ENTRY
    u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (u64)rows * cols) return;
    u64 r = i / cols, c = i % cols;
    out[i] = f2h(x[r * ld + c]);
}

