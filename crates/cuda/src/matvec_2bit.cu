// Decode mat-vec for split-layout IQ2_XXS ("mvq"): each lane takes whole 32-value groups (one 8-byte
// load gives 32 weights), R rows per warp reuse the group's activations, which come from shared memory
// (staged once per block, float4 slots XOR-swizzled so the lanes' 128-byte-strided reads do not
// collide in banks). Grid as mv4 (R rows per warp, ks warps per row group). One token.

extern "C" __global__ void __launch_bounds__(256, 2) mvq_iq2s_n1(MV_ARGS) { PDL_ENTRY
    extern __shared__ float4 xs4[];  // cols/4 slots
    __shared__ u64 grid[256];
    __shared__ float red[8][MVQ_R];
    grid[threadIdx.x] = iq2xxs_grid[threadIdx.x];
    int z = blockIdx.z;
    const float* xz = X + (u64)z * x_z;
    int nf = cols >> 2;
    for (int f = threadIdx.x; f < nf; f += blockDim.x) xs4[f ^ ((f >> 3) & 7)] = __ldg((const float4*)(xz + 4 * f));
    __syncthreads();
    int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, part = wid % ks;
    int r0 = (blockIdx.x * (8 / ks) + wid / ks) * MVQ_R;
    int mat = eids ? eids[z] : z;
    const u8* wm = W + (u64)mat * w_mat_bytes;
    int nb = cols >> 8, ng = nb * 8, nsteps = (ng + 31) >> 5;
    u64 rb = (u64)nb * 66;
    float acc[MVQ_R];
#pragma unroll
    for (int r = 0; r < MVQ_R; r++) acc[r] = 0.0f;
    // Software pipelining: the next step's weight words are requested before this step's arithmetic.
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
        float4 xv[8];
#pragma unroll
        for (int k = 0; k < 8; k++) xv[k] = xs4[(8 * G + k) ^ (G & 7)];
#pragma unroll
        for (int r = 0; r < MVQ_R; r++) {
            u32 a0 = ac[r].x, a1 = ac[r].y;
            float db = h2f(dc[r]) * (0.5f + byte_f(a1 >> 28, 0)) * 0.25f;
            float sum = 0.0f;
#pragma unroll
            for (int l = 0; l < 4; l++) {
                u64 gv = grid[(a0 >> (8 * l)) & 255];
                u32 sg = ksign((a1 >> (7 * l)) & 127);
                u32 lo = (u32)gv, hi = (u32)(gv >> 32);
                float4 xa = xv[2 * l], xb = xv[2 * l + 1];
                sum += byte_f(lo, 0) * sgnx(xa.x, sg & 1u, 0) + byte_f(lo, 1) * sgnx(xa.y, (sg >> 1) & 1u, 0) + byte_f(lo, 2) * sgnx(xa.z, (sg >> 2) & 1u, 0) +
                       byte_f(lo, 3) * sgnx(xa.w, (sg >> 3) & 1u, 0) + byte_f(hi, 0) * sgnx(xb.x, (sg >> 4) & 1u, 0) + byte_f(hi, 1) * sgnx(xb.y, (sg >> 5) & 1u, 0) +
                       byte_f(hi, 2) * sgnx(xb.z, (sg >> 6) & 1u, 0) + byte_f(hi, 3) * sgnx(xb.w, (sg >> 7) & 1u, 0);
            }
            acc[r] += db * sum;
        }
    }
    mvq_store(acc, red, lane, wid, part, ks, r0, rows, Y + (u64)z * y_z);
}

// Decode mat-vec for Q2_K: lane (superblock half h, byte quad t) of one of the step's two superblocks
// reads 4 quant bytes = 16 weights (4 shifts) plus the 8 scale bytes and d/dmin of its half, 8 rows per
// warp, next step's words requested before this step's arithmetic; activations (4 float4 per lane,
// contiguous per quarter-warp) come straight from L1. One token.
extern "C" __global__ void __launch_bounds__(256, 2) mvq_q2_k_n1(MV_ARGS) { PDL_ENTRY
    __shared__ float red[8][MVQ_R];
    int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, part = wid % ks;
    int r0 = (blockIdx.x * (8 / ks) + wid / ks) * MVQ_R;
    int z = blockIdx.z;
    int mat = eids ? eids[z] : z;
    const u8* wm = W + (u64)mat * w_mat_bytes;
    const float* xz = X + (u64)z * x_z;
    int nb = cols >> 8, nsteps = (nb + 1) >> 1;
    u64 rb = (u64)nb * 84;
    int sbl = lane >> 4, h = (lane >> 3) & 1, t = lane & 7;
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
        const float* xb = xz + (u64)c * 256 + 128 * h + 4 * t;
        float4 xv[4];
        float xs[4];
#pragma unroll
        for (int s = 0; s < 4; s++) {
            xv[s] = __ldg((const float4*)(xb + 32 * s));
            xs[s] = xv[s].x + xv[s].y + xv[s].z + xv[s].w;
        }
#pragma unroll
        for (int r = 0; r < MVQ_R; r++) {
            float d = h2f(dc[r] & 0xffff), dmin = h2f(dc[r] >> 16);
            float sum = 0.0f;
#pragma unroll
            for (int s = 0; s < 4; s++) {
                int idx = 2 * s + (t >> 2);
                u32 sc = ((idx < 4 ? c0[r] >> (8 * idx) : c1[r] >> (8 * (idx - 4)))) & 255u;
                u32 qq = (qc[r] >> (2 * s)) & 0x03030303u;
                float dot = byte_f(qq, 0) * xv[s].x + byte_f(qq, 1) * xv[s].y + byte_f(qq, 2) * xv[s].z + byte_f(qq, 3) * xv[s].w;
                sum += d * byte_f(sc & 15u, 0) * dot - dmin * byte_f(sc >> 4, 0) * xs[s];
            }
            acc[r] += sum;
        }
    }
    mvq_store(acc, red, lane, wid, part, ks, r0, rows, Y + (u64)z * y_z);
}

