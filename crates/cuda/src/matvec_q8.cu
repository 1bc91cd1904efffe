
// ---- Decode mat-vecs with int8 activations (the CPU's Precision::Fast for Q2_K / IQ2_XXS) ----
// The activation row is quantized to Q8_K (blocks of 256: int8 values, one f32 scale) exactly as the
// CPU's quantize_row_q8_k, so the integer dot products per block equal the CPU's; only the order in
// which the per-block floats are summed differs. A 2-bit weight then costs a byte operation and a
// quarter of a dp4a instead of a lookup, a sign flip and an FMA on f32.

// Q8_K quantization of `gridDim.y` rows of `cols` floats (row stride `x_z`): block b of row z to
// Q[z * cols + 256 b ..] and D[z * cols / 256 + b]. The scale comes from the value of largest
// magnitude (the first one on ties, as the CPU picks it); q = round-half-even(-127 / max * x).
extern "C" __global__ void q8k_quant(const float* __restrict__ X, int x_z, int cols, signed char* __restrict__ Q, float* __restrict__ D) { PDL_ENTRY
    __shared__ u64 red[8];
    __shared__ float mx;
    int b = blockIdx.x, z = blockIdx.y, t = threadIdx.x;
    const float* xb = X + (u64)z * x_z + (u64)b * 256;
    float v = xb[t];
    u64 key = ((u64)__float_as_uint(fabsf(v)) << 32) | (u32)(255 - t);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        u64 k2 = __shfl_xor_sync(0xffffffffu, key, o);
        key = k2 > key ? k2 : key;
    }
    if ((t & 31) == 0) red[t >> 5] = key;
    __syncthreads();
    if (t == 0) {
        u64 k = red[0];
        for (int i = 1; i < 8; i++) k = red[i] > k ? red[i] : k;
        mx = xb[255 - (int)(k & 255)];
    }
    __syncthreads();
    float m = mx;
    u64 qo = (u64)z * cols + (u64)b * 256;
    u64 dof = (u64)z * (cols >> 8) + b;
    if (m == 0.0f) {
        Q[qo + t] = 0;
        if (t == 0) D[dof] = 0.0f;
        return;
    }
    float iscale = -127.0f / m;
    Q[qo + t] = (signed char)min((int)rintf(iscale * v), 127);
    if (t == 0) D[dof] = 1.0f / iscale;
}

// 0xff in byte k for each set bit k of the 4-bit `s` (the bits land on distinct positions: no carries).
__device__ __forceinline__ u32 sign_mask4(u32 s) { return ((s * 0x00204081u) & 0x01010101u) * 0xffu; }

#define MVQ8_ARGS const u8* __restrict__ W, u64 w_mat_bytes, const int* __restrict__ eids, const signed char* __restrict__ XQ, \
    const float* __restrict__ XD, int xq_z, float* __restrict__ Y, int y_z, int rows, int cols, int ks

// IQ2_XXS (split layout) · Q8_K: the grid of mvq_iq2s_n1 (R rows per warp, whole 32-value groups per
// lane, next step's weight words requested before this step's arithmetic); a lane's 32 int8
// activations are two 16-byte loads reused over the R rows. Signed grid bytes: (g ^ m) + (m & 1)
// per byte is -g where the mask m is 0xff (grid bytes are 8..43, so no byte carries).
extern "C" __global__ void __launch_bounds__(256, 2) mvq8_iq2s_n1(MVQ8_ARGS) { PDL_ENTRY
    __shared__ u64 grid[256];
    __shared__ float red[8][MVQ_R];
    grid[threadIdx.x] = iq2xxs_grid[threadIdx.x];
    __syncthreads();
    int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, part = wid % ks;
    int r0 = (blockIdx.x * (8 / ks) + wid / ks) * MVQ_R;
    int z = blockIdx.z;
    int mat = eids ? eids[z] : z;
    const u8* wm = W + (u64)mat * w_mat_bytes;
    const signed char* xq = XQ + (u64)z * xq_z;
    const float* xd = XD + (u64)z * (xq_z >> 8);
    int nb = cols >> 8, ng = nb * 8, nsteps = (ng + 31) >> 5;
    u64 rb = (u64)nb * 66;
    float acc[MVQ_R];
#pragma unroll
    for (int r = 0; r < MVQ_R; r++) acc[r] = 0.0f;
    uint2 a[MVQ_R];
    u16 dh[MVQ_R];
    auto fetch = [&](int st) { iq2s_fetch(wm, rb, nb, ng, r0, rows, st, lane, a, dh); };
    if (part < nsteps) fetch(part);
    for (int st = part; st < nsteps; st += ks) {
        int G = st * 32 + lane;
        uint2 ac[MVQ_R];
        u16 dc[MVQ_R];
#pragma unroll
        for (int r = 0; r < MVQ_R; r++) { ac[r] = a[r]; dc[r] = dh[r]; }
        if (st + ks < nsteps) fetch(st + ks);
        if (G >= ng) continue;
        const int4* xp = (const int4*)(xq + 32 * G);
        int4 x0 = __ldg(xp), x1 = __ldg(xp + 1);
        int xw[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
        float dx = __ldg(xd + (G >> 3)) * 0.125f;
#pragma unroll
        for (int r = 0; r < MVQ_R; r++) {
            u32 a0 = ac[r].x, a1 = ac[r].y;
            int s = 0;
#pragma unroll
            for (int l = 0; l < 4; l++) {
                u64 gv = grid[(a0 >> (8 * l)) & 255];
                u32 sg = ksign((a1 >> (7 * l)) & 127);
                u32 mlo = sign_mask4(sg & 15u), mhi = sign_mask4(sg >> 4);
                s = __dp4a((int)(((u32)gv ^ mlo) + (mlo & 0x01010101u)), xw[2 * l], s);
                s = __dp4a((int)(((u32)(gv >> 32) ^ mhi) + (mhi & 0x01010101u)), xw[2 * l + 1], s);
            }
            acc[r] += h2f(dc[r]) * dx * (float)((2 * (int)(a1 >> 28) + 1) * s);
        }
    }
    mvq_store(acc, red, lane, wid, part, ks, r0, rows, Y + (u64)z * y_z);
}

// Q2_K · Q8_K: the lane mapping of mvq_q2_k_n1 (superblock half h, byte quad t: 16 weights at 4
// shifts). A 2-bit quant times its 4-bit scale fits a byte (<= 45), so one multiply scales four
// quants and a dp4a takes the dot; the min term uses the lane's sums of four activations.
extern "C" __global__ void __launch_bounds__(256, 2) mvq8_q2_k_n1(MVQ8_ARGS) { PDL_ENTRY
    __shared__ float red[8][MVQ_R];
    int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, part = wid % ks;
    int r0 = (blockIdx.x * (8 / ks) + wid / ks) * MVQ_R;
    int z = blockIdx.z;
    int mat = eids ? eids[z] : z;
    const u8* wm = W + (u64)mat * w_mat_bytes;
    const signed char* xq = XQ + (u64)z * xq_z;
    const float* xd = XD + (u64)z * (xq_z >> 8);
    int nb = cols >> 8, nsteps = (nb + 1) >> 1;
    u64 rb = (u64)nb * 84;
    int sbl = lane >> 4, h = (lane >> 3) & 1, t = lane & 7;
    // Scale bytes 2s + t/4 (s = 0..3) of the half's 8, gathered into one word by a byte permute.
    u32 sel = (u32)(t >> 2) * 0x1111u + 0x6420u;
    float acc[MVQ_R];
#pragma unroll
    for (int r = 0; r < MVQ_R; r++) acc[r] = 0.0f;
    u32 q[MVQ_R], s0[MVQ_R], s1[MVQ_R], dd[MVQ_R];
    auto fetch = [&](int st) { q2k_fetch(wm, rb, nb, r0, rows, min(2 * st + sbl, nb - 1), h, t, q, s0, s1, dd); };
    if (part < nsteps) fetch(part);
    for (int st = part; st < nsteps; st += ks) {
        u32 qc[MVQ_R], c0[MVQ_R], c1[MVQ_R], dc[MVQ_R];
#pragma unroll
        for (int r = 0; r < MVQ_R; r++) { qc[r] = q[r]; c0[r] = s0[r]; c1[r] = s1[r]; dc[r] = dd[r]; }
        if (st + ks < nsteps) fetch(st + ks);
        int c = 2 * st + sbl;
        if (c >= nb) continue;
        const int* xb = (const int*)(xq + (u64)c * 256 + 128 * h + 4 * t);
        int xw[4], xs[4];
#pragma unroll
        for (int s = 0; s < 4; s++) {
            xw[s] = __ldg(xb + 8 * s);
            xs[s] = __dp4a(xw[s], 0x01010101, 0);
        }
        float dx = __ldg(xd + c);
#pragma unroll
        for (int r = 0; r < MVQ_R; r++) {
            u32 sc = __byte_perm(c0[r], c1[r], sel);
            int is = 0, ms = 0;
#pragma unroll
            for (int s = 0; s < 4; s++) {
                u32 qq = (qc[r] >> (2 * s)) & 0x03030303u;
                is = __dp4a((int)(qq * ((sc >> (8 * s)) & 15u)), xw[s], is);
                ms += (int)((sc >> (8 * s + 4)) & 15u) * xs[s];
            }
            acc[r] += dx * (h2f(dc[r] & 0xffff) * (float)is - h2f(dc[r] >> 16) * (float)ms);
        }
    }
    mvq_store(acc, red, lane, wid, part, ks, r0, rows, Y + (u64)z * y_z);
}

// Q8_0 quantization of `gridDim.y` rows of `cols` floats (row stride `x_z`) as the CPU's
// quantize_row_q8_0: one warp per 32 values, d = amax / 127, q = round-half-away(x / d); the scale
// is kept as the f16 the CPU stores (widened to f32): Q[z * cols + j], D[z * cols / 32 + j / 32].
extern "C" __global__ void q80_quant(const float* __restrict__ X, int x_z, int cols, signed char* __restrict__ Q, float* __restrict__ D) { PDL_ENTRY
    int z = blockIdx.y, j = blockIdx.x * 256 + threadIdx.x;
    float v = X[(u64)z * x_z + j];
    float amax = warp_max(fabsf(v));
    float d = amax / 127.0f;
    float id = d != 0.0f ? 1.0f / d : 0.0f;
    Q[(u64)z * cols + j] = (signed char)(int)roundf(v * id);
    if ((threadIdx.x & 31) == 0) D[(u64)z * (cols >> 5) + (j >> 5)] = h2f(f2h(d));
}

// Split-layout Q8_0 · Q8_0: a lane takes whole 32-value blocks (two 16-byte payload loads per row,
// all R rows issued before the arithmetic), eight dp4a per block and row. Activation scales are
// per 32 values here (D row stride xq_z / 32).
extern "C" __global__ void __launch_bounds__(256, 2) mvq8_q8s_n1(MVQ8_ARGS) { PDL_TRIGGER
    __shared__ float red[8][MVQ_R];
    int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, part = wid % ks;
    int r0 = (blockIdx.x * (8 / ks) + wid / ks) * MVQ_R;
    int z = blockIdx.z;
    // Weights do not depend on the previous kernel: without expert ids the first weight loads are
    // issued before waiting for it (their DRAM latency overlaps its tail).
    if (eids) { PDL_WAIT }
    int mat = eids ? eids[z] : z;
    const u8* wm = W + (u64)mat * w_mat_bytes;
    const signed char* xq = XQ + (u64)z * xq_z;
    const float* xd = XD + (u64)z * (xq_z >> 5);
    int nb = cols >> 5, nsteps = (nb + 31) >> 5;
    u64 rb = (u64)nb * 34;
    float acc[MVQ_R];
#pragma unroll
    for (int r = 0; r < MVQ_R; r++) acc[r] = 0.0f;
    for (int st = part; st < nsteps; st += ks) {
        int b = st * 32 + lane;
        if (b >= nb) continue;
        uint4 w0[MVQ_R], w1[MVQ_R];
        u16 dw[MVQ_R];
#pragma unroll
        for (int r = 0; r < MVQ_R; r++) {
            const u8* wr = wm + (u64)min(r0 + r, rows - 1) * rb;
            w0[r] = *(const uint4*)(wr + 32 * b);
            w1[r] = *(const uint4*)(wr + 32 * b + 16);
            dw[r] = ld16(wr + cols + 2 * b);
        }
        PDL_WAIT
        const int4* xp = (const int4*)(xq + 32 * b);
        int4 x0 = __ldg(xp), x1 = __ldg(xp + 1);
        float dx = __ldg(xd + b);
#pragma unroll
        for (int r = 0; r < MVQ_R; r++) {
            int s = __dp4a((int)w0[r].x, x0.x, 0);
            s = __dp4a((int)w0[r].y, x0.y, s);
            s = __dp4a((int)w0[r].z, x0.z, s);
            s = __dp4a((int)w0[r].w, x0.w, s);
            s = __dp4a((int)w1[r].x, x1.x, s);
            s = __dp4a((int)w1[r].y, x1.y, s);
            s = __dp4a((int)w1[r].z, x1.z, s);
            s = __dp4a((int)w1[r].w, x1.w, s);
            acc[r] += (float)s * (h2f(dw[r]) * dx);
        }
    }
    PDL_WAIT  // (threads that loaded no block) the output may still be read by the previous kernel
    mvq_store(acc, red, lane, wid, part, ks, r0, rows, Y + (u64)z * y_z);
}
