
// ---------------------------------------------------------------------------------------------
// Decode attention: one token at the device position, with the query's per-head RMS norm (no weight)
// and rope folded in. Every head shares one KV row per candidate (MQA), so the work is a small
// Q·Kᵀ and P·V over a few hundred KB; it is latency-bound, and both kernels keep a block's chain short.
//   attn_dec: block (ADEC_HG heads, chunk of ADEC_CH candidates) starts the raw queries and the chunk's
//     rows in one round of cp.async (the rows wait only for their selection index, if selected),
//     normalises + ropes the queries in shared memory as norm_rope_qat does, and writes its
//     unnormalised partial output with the chunk's (max, sum). Small blocks spread the work: 64 heads
//     x 160 candidates are 80 blocks, x 640 are 320; a warp holds 4 heads' query columns in registers,
//     so a row value read from shared memory serves 4 heads.
//   attn_dec_merge: block (head, 128 output dims) combines the chunks with the sink, applies the
//     inverse rope, stores this token's row into the ring and writes the Q8_0 copy of the output.
// Both read the position from `dpos` before the PDL wait (the host writes it ahead of the step's first
// kernel), as they read the weights `freqs` / `sinks`: blocks past the position's candidates leave
// without waiting and the rope factors are ready when the wait ends. Block (x, 0) of attn_dec always
// has candidates and waits, so the grid still completes only after its predecessor.
// ---------------------------------------------------------------------------------------------
#define ADEC_HG 8   // heads per block; warp h computes head h's norm and softmax
#define ADEC_CH 16  // candidates per chunk; ADEC_CH in lib.rs (dec_attn) matches
#define ADEC_MB 8   // chunks a merge warp loads per round

// Address of candidate c: the raw window of nraw positions ending at pos (this token's row in kvb, and
// the rows of the `before` tokens of the same step before it just below it in kvb; the earlier ones in
// the ring), then the compressed rows (the indexer's selection when use_sel).
__device__ __forceinline__ const float* attn_row(int c, int nraw, int pos, int swa, bool use_sel, const float* kvb, const float* ring, const float* comp,
                                                const int* sel, int d, int before) {
    if (c < nraw) {
        int p = pos + 1 - nraw + c;
        int back = pos - p;
        return back <= before ? kvb - (u64)back * d : ring + (u64)(p % swa) * d;
    }
    int r = c - nraw;
    if (use_sel) r = sel[r];
    return comp + (u64)r * d;
}

// Rotation of one pair, as norm_rope_qat.
__device__ __forceinline__ void rope_pair(float& a, float& b, float cf, float sf) {
    float x0 = a, x1 = b;
    a = x0 * cf - x1 * sf;
    b = x0 * sf + x1 * cf;
}

// 256 threads. Shared memory (floats): ADEC_HG x d queries (raw, then normalised and roped), ADEC_CH x d
// chunk rows, ADEC_HG x ADEC_CH scores, ADEC_CH x ADEC_HG probabilities, half cos + half sin.
// JM = float4 columns per lane and head (d <= 128 JM). Grid (head groups, <= nsplit): block y takes
// chunks y, y + gridDim.y, .. (a bounded grid: at long contexts blocks loop instead of thousands of
// blocks that find no candidates). Partial of chunk s, head h: part[(s nh + h) d ..], its (max, sum)
// at part[nsplit nh d + 2 (s nh + h)].
template <int JM>
__device__ __forceinline__ void attn_dec_impl(const float* __restrict__ q, const float* __restrict__ kvb, const float* __restrict__ ring,
                                              const float* __restrict__ comp, const int* __restrict__ sel, float* __restrict__ part, int nh, int d,
                                              long long pos, int swa, int ratio, int topk, int nsplit, const long long* dpos,
                                              const double* __restrict__ freqs, int half, float eps, long long pstride) {
    static_assert(ADEC_HG == 8 && ADEC_CH == 16, "warp roles below assume 8 heads x 16 candidates, 8 warps");
    extern __shared__ __align__(16) float adsm[];
    // Grid z: consecutive tokens of one sequence (a verify step), each with its own query, KV row,
    // selection, partials and position; token z reads the z tokens before it from kvb (their ring
    // slots are written by the merge, after every token's reads).
    const int z = blockIdx.z;
    q += (u64)z * nh * d;
    kvb += (u64)z * d;
    if (sel) sel += (u64)z * topk;
    part += (u64)z * pstride;
    if (dpos) pos = dpos[z];
    else pos += z;
    // Positions fit in 32 bits: 32-bit divisions (the 64-bit ones are subroutine calls).
    int ip = (int)pos;
    int nraw = min(ip + 1, swa);
    int nc = ratio ? (ip + 1) / ratio : 0;
    int ncand = nraw + (sel && nc > topk ? topk : nc);
    int used = (ncand + ADEC_CH - 1) / ADEC_CH;
    if ((int)blockIdx.y >= used) return;
    int dq = d / 4, tid = threadIdx.x, lane = tid & 31, w = tid >> 5;
    int h0 = blockIdx.x * ADEC_HG, nhg = min(ADEC_HG, nh - h0);
    float* qs = adsm;
    float* rows = qs + ADEC_HG * d;
    float* sc = rows + ADEC_CH * d;
    float* pt = sc + ADEC_HG * ADEC_CH;
    float* rc = pt + ADEC_CH * ADEC_HG;
    float* rs = rc + half;
    for (int i = tid; i < half; i += 256) {
        double s, c;
        sincos((double)pos * freqs[i], &s, &c);
        rc[i] = (float)c;
        rs[i] = (float)s;
    }
    PDL_WAIT
    // The group's raw queries, in flight with the first chunk's rows (absent heads: zeros).
    for (int u = tid; u < ADEC_HG * dq; u += 256) {
        bool ok = u < nhg * dq;
        cp_async16(qs + 4 * u, ok ? q + (u64)h0 * d + 4 * (u64)u : q, ok ? 16 : 0);
    }
    const float scale = 1.0f / sqrtf((float)d);
    const int tail0 = d - 2 * half;
    float* ml = part + (u64)nsplit * nh * d;
    for (int sp = blockIdx.y; sp < used; sp += gridDim.y) {
        int c0 = sp * ADEC_CH, ncv = min(ADEC_CH, ncand - c0);
        {
            // 256 / ADEC_CH threads per row: one address (one index load, if selected) per thread.
            int c = tid / (256 / ADEC_CH);
            bool ok = c < ncv;
            const float* row = ok ? attn_row(c0 + c, nraw, ip, swa, sel && nc > topk, kvb, ring, comp, sel, d, z) : q;
            for (int j = tid % (256 / ADEC_CH); j < dq; j += 256 / ADEC_CH) cp_async16(rows + c * d + 4 * j, row + 4 * j, ok ? 16 : 0);
        }
        asm volatile("cp.async.commit_group;\n" ::: "memory");
        asm volatile("cp.async.wait_group 0;\n" ::: "memory");
        __syncthreads();
        if (sp == (int)blockIdx.y) {
            // Warp h normalises and ropes head h in place, once per block: 1 / RMS from the sum of
            // squares in double, then v * inv and the rotation, as norm_rope_qat.
            float* qh = qs + w * d;
            double ss = 0.0;
            for (int f = lane; f < dq; f += 32) {
                float4 x = *(const float4*)(qh + 4 * f);
                ss += (double)x.x * (double)x.x;
                ss += (double)x.y * (double)x.y;
                ss += (double)x.z * (double)x.z;
                ss += (double)x.w * (double)x.w;
            }
            ss = warp_sum_d(ss);
            float iv = 1.0f / sqrtf((float)(ss / d) + eps);
            for (int f = lane; f < dq; f += 32) {
                int k = 4 * f;
                float4 x = *(const float4*)(qh + k);
                x.x *= iv;
                x.y *= iv;
                x.z *= iv;
                x.w *= iv;
                if (k >= tail0) rope_pair(x.x, x.y, rc[(k - tail0) >> 1], rs[(k - tail0) >> 1]);
                if (k + 2 >= tail0) rope_pair(x.z, x.w, rc[(k + 2 - tail0) >> 1], rs[(k + 2 - tail0) >> 1]);
                *(float4*)(qh + k) = x;
            }
            __syncthreads();
        }
        {
            // Warp (hq, cq): heads 4 hq .. 4 hq + 3 against candidates 4 cq .. 4 cq + 3; lane owns float4
            // columns lane + 32 j. The queries come into registers two columns at a time (all 16 dot
            // products accumulate across the passes): a row value read from shared memory serves 4 heads
            // without the whole query row held at once.
            int hq = w & 1, cq = w >> 1;
            float s[16];
#pragma unroll
            for (int i = 0; i < 16; i++) s[i] = 0.0f;
#pragma unroll
            for (int j0 = 0; j0 < JM; j0 += 2) {
                float4 qv[4][2];
#pragma unroll
                for (int hh = 0; hh < 4; hh++)
#pragma unroll
                    for (int jj = 0; jj < 2; jj++) {
                        int f = lane + 32 * (j0 + jj);
                        qv[hh][jj] = f < dq ? *(const float4*)(qs + (4 * hq + hh) * d + 4 * f) : make_float4(0.f, 0.f, 0.f, 0.f);
                    }
#pragma unroll
                for (int ci = 0; ci < 4; ci++) {
                    const float* rw = rows + (4 * cq + ci) * d;
#pragma unroll
                    for (int jj = 0; jj < 2; jj++) {
                        // Columns past d (d < 128 JM): a zero query against column 0, no branch.
                        int f = lane + 32 * (j0 + jj);
                        float4 r = *(const float4*)(rw + 4 * (f < dq ? f : 0));
#pragma unroll
                        for (int hh = 0; hh < 4; hh++) {
                            float4 x = qv[hh][jj];
                            s[4 * ci + hh] = fmaf(x.w, r.w, fmaf(x.z, r.z, fmaf(x.y, r.y, fmaf(x.x, r.x, s[4 * ci + hh]))));
                        }
                    }
                }
            }
            // Value 4 ci + hh ends in lanes 2 (4 ci + hh), + 1; rows past the chunk's candidates (zeros) score -inf.
            s[0] = warp_sum_scatter<16>(s);
            int ci = lane >> 3, hh = (lane >> 1) & 3, c = 4 * cq + ci;
            if ((lane & 1) == 0) sc[(4 * hq + hh) * ADEC_CH + c] = c < ncv ? s[0] * scale : -INFINITY;
        }
        __syncthreads();
        {
            // Warp h: softmax pieces of head h over the chunk (lane = candidate).
            float v = lane < ADEC_CH ? sc[w * ADEC_CH + lane] : -INFINITY;
            float mx = warp_max(v);
            float p = v == -INFINITY ? 0.0f : expf(v - mx);
            float sum = warp_sum(p);
            if (lane < ADEC_CH) pt[lane * ADEC_HG + w] = p;
            if (lane == 0 && w < nhg) *(float2*)(ml + ((u64)sp * nh + h0 + w) * 2) = make_float2(mx, sum);
        }
        __syncthreads();
        // Thread: output dims 2 k2, 2 k2 + 1 of every head of the group over the chunk's rows.
        for (int k2 = tid; 2 * k2 < d; k2 += 256) {
            float2 acc[ADEC_HG];
#pragma unroll
            for (int h = 0; h < ADEC_HG; h++) acc[h] = make_float2(0.f, 0.f);
#pragma unroll 2
            for (int c = 0; c < ncv; c++) {
                float2 r = *(const float2*)(rows + c * d + 2 * k2);
                float4 pa = *(const float4*)(pt + c * ADEC_HG), pb = *(const float4*)(pt + c * ADEC_HG + 4);
                float pv[ADEC_HG] = {pa.x, pa.y, pa.z, pa.w, pb.x, pb.y, pb.z, pb.w};
#pragma unroll
                for (int h = 0; h < ADEC_HG; h++) {
                    acc[h].x += pv[h] * r.x;
                    acc[h].y += pv[h] * r.y;
                }
            }
#pragma unroll
            for (int h = 0; h < ADEC_HG; h++)
                if (h < nhg) *(float2*)(part + ((u64)sp * nh + h0 + h) * d + 2 * k2) = acc[h];
        }
        __syncthreads();  // the next chunk rewrites rows, scores and probabilities
    }
}

#define ADEC_ARGS const float* q, const float* kvb, const float* ring, const float* comp, const int* sel, float* part, int nh, int d, long long pos0, \
    int swa, int ratio, int topk, int nsplit, const long long* dpos, const double* freqs, int half, float eps, long long pstride
#define ADEC_CALL q, kvb, ring, comp, sel, part, nh, d, pos0, swa, ratio, topk, nsplit, dpos, freqs, half, eps, pstride
// d <= 512, and the wide variant for d <= 1024 (twice the query registers).
extern "C" __global__ void __launch_bounds__(256, 3) attn_dec(ADEC_ARGS) { PDL_TRIGGER attn_dec_impl<4>(ADEC_CALL); }
extern "C" __global__ void __launch_bounds__(256) attn_dec_w(ADEC_ARGS) { PDL_TRIGGER attn_dec_impl<8>(ADEC_CALL); }

// Grid (nh, ceil(d / 128)), 256 threads: block (head h, output dims 128 y ..), lane = 4 dims; warp w
// combines chunks w, w + 8, .. with a round's loads in flight together, and the warps' sums meet in
// shared memory: out[h] = sum_s e^(m_s - M) part_s / (e^(sink - M) + sum_s e^(m_s - M) l_s), M the
// largest of the sink and the m_s. `nsplit` is the stride the partials were written with; the chunks
// in use follow from the position.
extern "C" __global__ void __launch_bounds__(256) attn_dec_merge(const float* __restrict__ part, const float* __restrict__ sinks, float* __restrict__ o, int nh, int d,
                                                                 long long pos, int nsplit, int swa, int ratio, int topk, const int* sel,
                                                                 const double* __restrict__ freqs, int half, const long long* dpos, const float* kvb, float* ring,
                                                                 signed char* q80, float* d80, long long pstride) {
    PDL_TRIGGER
    // Grid z: the tokens of attn_dec's grid z, each its own output and ring row.
    const int z = blockIdx.z;
    part += (u64)z * pstride;
    o += (u64)z * nh * d;
    kvb += (u64)z * d;
    if (sel) sel += (u64)z * topk;
    if (q80) {
        q80 += (u64)z * nh * d;
        d80 += (u64)z * nh * d / 32;
    }
    if (dpos) pos = dpos[z];
    else pos += z;
    int h = blockIdx.x, lane = threadIdx.x & 31, w = threadIdx.x >> 5, k = blockIdx.y * 128 + 4 * lane;
    bool on = k < d;
    int ip = (int)pos;
    int nc = ratio ? (ip + 1) / ratio : 0;
    int ncand = min(ip + 1, swa) + (sel && nc > topk ? topk : nc);
    int used = (ncand + ADEC_CH - 1) / ADEC_CH;
    float sink = sinks[h];
    // Inverse-rope factors of the lane's two pairs (as attn_store), from the position and the weights.
    int tail0 = d - 2 * half;
    float ca = 1.0f, sa = 0.0f, cb = 1.0f, sb = 0.0f;
    if (w == 0 && on) {
        double s, c;
        if (k >= tail0) {
            sincos((double)pos * freqs[(k - tail0) >> 1], &s, &c);
            ca = (float)c;
            sa = -(float)s;
        }
        if (k + 2 >= tail0) {
            sincos((double)pos * freqs[(k + 2 - tail0) >> 1], &s, &c);
            cb = (float)c;
            sb = -(float)s;
        }
    }
    PDL_WAIT
    // The ring update of this token (slot pos % swa held position pos - swa, outside every window read).
    if (h == 0 && ring && w == 0 && on) *(float4*)(ring + (u64)(ip % swa) * d + k) = *(const float4*)(kvb + k);
    const float* ml = part + (u64)nsplit * nh * d;
    float M = sink, den = 0.0f;
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
    for (int s0 = w; s0 < used; s0 += 8 * ADEC_MB) {
        float4 v[ADEC_MB];
        float2 mv[ADEC_MB];
#pragma unroll
        for (int b = 0; b < ADEC_MB; b++) {
            int s = s0 + 8 * b;
            bool ok = s < used;
            v[b] = ok && on ? *(const float4*)(part + ((u64)s * nh + h) * d + k) : make_float4(0.f, 0.f, 0.f, 0.f);
            mv[b] = ok ? *(const float2*)(ml + ((u64)s * nh + h) * 2) : make_float2(-INFINITY, 0.0f);
        }
        if (s0 == w) {
            // The largest chunk max, by every warp alone (its loads overlap the round's above).
            for (int s = lane; s < used; s += 32) M = fmaxf(M, ml[((u64)s * nh + h) * 2]);
            M = warp_max(M);
        }
#pragma unroll
        for (int b = 0; b < ADEC_MB; b++) {
            float f = mv[b].x == -INFINITY ? 0.0f : expf(mv[b].x - M);
            den += f * mv[b].y;
            acc.x += f * v[b].x;
            acc.y += f * v[b].y;
            acc.z += f * v[b].z;
            acc.w += f * v[b].w;
        }
    }
    __shared__ float4 red[8][32];
    __shared__ float dred[8];
    red[w][lane] = acc;
    if (lane == 0) dred[w] = den;
    __syncthreads();
    if (w) return;
    // Warp 0 (whose M covers chunk 0, so every chunk) sums the warps in order.
    for (int i = 1; i < 8; i++) {
        float4 a = red[i][lane];
        acc.x += a.x;
        acc.y += a.y;
        acc.z += a.z;
        acc.w += a.w;
        den += dred[i];
    }
    den += expf(sink - M);
    float inv = 1.0f / den;
    float4 r = make_float4(acc.x * inv, acc.y * inv, acc.z * inv, acc.w * inv);
    if (k >= tail0) rope_pair(r.x, r.y, ca, sa);
    if (k + 2 >= tail0) rope_pair(r.z, r.w, cb, sb);
    if (on) *(float4*)(o + (u64)h * d + k) = r;
    if (q80) {
        // Q8_0 copy of the head's output for the int8 output projection (d % 32 == 0: eight lanes
        // hold one block), as q80_quant.
        float amax = fmaxf(fmaxf(fabsf(r.x), fabsf(r.y)), fmaxf(fabsf(r.z), fabsf(r.w)));
#pragma unroll
        for (int m = 1; m < 8; m <<= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, m));
        float dd = amax / 127.0f;
        float id = dd != 0.0f ? 1.0f / dd : 0.0f;
        if (on) {
            u64 j = (u64)h * d + k;
            char4 qv = make_char4((signed char)(int)roundf(r.x * id), (signed char)(int)roundf(r.y * id), (signed char)(int)roundf(r.z * id),
                                  (signed char)(int)roundf(r.w * id));
            *(char4*)(q80 + j) = qv;
            if ((lane & 7) == 0) d80[j >> 5] = h2f(f2h(dd));
        }
    }
}
