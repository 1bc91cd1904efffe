// ---------------------------------------------------------------------------------------------
// MoE: router, SwiGLU, grouping, combining.
// ---------------------------------------------------------------------------------------------
// One block (>= n_expert threads, <= 1024) per token.
extern "C" __global__ void route(const float* logits, int ne, const float* bias, const int* hash, const u32* tokens, int k, int normalize,
                                 float scale, int* eids, float* ew) { PDL_ENTRY
    int i = blockIdx.x, t = threadIdx.x;
    route_token(t < ne ? logits[(u64)i * ne + t] : 0.0f, i, ne, bias, hash, tokens, k, normalize, scale, eids, ew);
}

// Decode router in one launch: the gate logits (F16 rows `W`, ne x e) four rows per block (warp w: row
// 4 blockIdx.x + w / 2, column half w % 2), written to `logits`; the last block to finish (ticket)
// routes the token. Grid row y routes token y (x, logits, tokens, eids and ew at its row; its ticket
// 4 ints past the previous row's), each as a one-token launch does. 256 threads, ne <= 256 and a
// multiple of 4, e a multiple of 16.
extern "C" __global__ void __launch_bounds__(256) gate_route_dec(const u16* __restrict__ W, const float* __restrict__ x, int e, float* logits, int* ticket,
                                                                 int ne, const float* bias, const int* hash, const u32* tokens, int k, int normalize,
                                                                 float scale, int* eids, float* ew) { PDL_ENTRY
    __shared__ float part[8];
    __shared__ int last;
    int t = threadIdx.x, lane = t & 31, w = t >> 5, row = 4 * blockIdx.x + (w >> 1), half = w & 1;
    if (blockIdx.y) {
        const u64 y = blockIdx.y;
        x += y * e;
        logits += y * ne;
        ticket += 4 * y;
        if (tokens) tokens += y;
        eids += y * k;
        ew += y * k;
    }
    const u16* wr = W + (u64)row * e;
    float s = 0.0f;
    for (int c0 = half * (e / 2) + 8 * lane; c0 < (half + 1) * (e / 2); c0 += 4 * 256) {
        uint4 wq[4];
        float4 xa[4], xb[4];
#pragma unroll
        for (int u = 0; u < 4; u++) {
            int c = c0 + 256 * u;
            bool on = c < (half + 1) * (e / 2);
            wq[u] = on ? *(const uint4*)(wr + c) : make_uint4(0, 0, 0, 0);
            xa[u] = on ? *(const float4*)(x + c) : make_float4(0.f, 0.f, 0.f, 0.f);
            xb[u] = on ? *(const float4*)(x + c + 4) : make_float4(0.f, 0.f, 0.f, 0.f);
        }
#pragma unroll
        for (int u = 0; u < 4; u++) {
            float xv[8] = {xa[u].x, xa[u].y, xa[u].z, xa[u].w, xb[u].x, xb[u].y, xb[u].z, xb[u].w};
            u32 ww[4] = {wq[u].x, wq[u].y, wq[u].z, wq[u].w};
#pragma unroll
            for (int q = 0; q < 4; q++) {
                s += h2f((u16)(ww[q] & 0xffff)) * xv[2 * q];
                s += h2f((u16)(ww[q] >> 16)) * xv[2 * q + 1];
            }
        }
    }
    s = warp_sum(s);
    if (lane == 0) part[w] = s;
    __syncthreads();
    if (t < 4) logits[4 * blockIdx.x + t] = part[2 * t] + part[2 * t + 1];
    __threadfence();
    __syncthreads();
    if (t == 0) {
        int kk = atomicAdd(ticket, 1);
        last = kk == (int)gridDim.x - 1;
        if (last) *ticket = 0;
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
    route_token(t < ne ? __ldcg(logits + t) : 0.0f, 0, ne, bias, hash, tokens, k, normalize, scale, eids, ew);
}

// a = silu(min(a, c)) * clamp(b, -c, c) * (w ? w[row] : 1), rows of ff.
// Optional int8 copies for the next one-token product (256 threads, total % 256 == 0): q80 = Q8_0,
// q8k = Q8_K (row-major, blocks of 32 / 256 of the output).
extern "C" __global__ void swiglu(float* a, const float* b, u64 total, int ff, float c, const float* w, signed char* q80, float* d80,
                                  signed char* q8k, float* d8k) { PDL_ENTRY
    __shared__ u64 redk[8];
    u64 idx = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    bool on = idx < total;
    float r = 0.0f;
    if (on) {
        float x = fminf(a[idx], c), y = fminf(fmaxf(b[idx], -c), c);
        r = siluf_(x) * y;
        if (w) r *= w[idx / ff];
        a[idx] = r;
    }
    if (q80 && on) q80_warp(r, idx, q80, d80);
    if (q8k) q8k_group(r, idx >> 8, on, q8k, d8k, redk);
}

// MoE combination and the sub-layer exit (hc_post) in one pass: y = sum_s rows[slot_of(i,s)] (+ add[i])
// (slot_pos null => i*k+s), then the new streams of column j of token i.
extern "C" __global__ void moe_combine_post(const float* rows, const int* slot_pos, int k, const float* add, const float* mixes, int nh, float* x, int e) { PDL_ENTRY
    int i = blockIdx.y, j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= e) return;
    float acc = 0.0f;
    for (int s = 0; s < k; s++) {
        int r = slot_pos ? slot_pos[i * k + s] : i * k + s;
        acc += rows[(u64)r * e + j];
    }
    if (add) acc += add[(u64)i * e + j];
    const float* mo = mixes + (u64)i * (nh + nh * nh);
    float* xi = x + (u64)i * nh * e;
    float old[16];
    for (int r = 0; r < nh; r++) old[r] = xi[r * e + j];
    for (int c = 0; c < nh; c++) {
        float o = __fmul_rn(mo[c], acc);
        for (int r = 0; r < nh; r++) o = __fmaf_rn(mo[nh + r * nh + c], old[r], o);
        xi[c * e + j] = o;
    }
}

extern "C" __global__ void moe_count(const int* eids, int total, int* counts) { PDL_ENTRY
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t < total) atomicAdd(&counts[eids[t]], 1);
}

// Scatter (token, slot) pairs into expert-sorted order: gathered inputs, weights, slot positions.
extern "C" __global__ void moe_scatter(const int* eids, const float* ew, int total, int k, int* cursor, int* slot_pos, float* gw, int* gtok) { PDL_ENTRY
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= total) return;
    int p = atomicAdd(&cursor[eids[t]], 1);
    slot_pos[t] = p;
    gw[p] = ew[t];
    gtok[p] = t / k;
}

extern "C" __global__ void gather_rows(const float* x, const int* gtok, float* out, int e) { PDL_ENTRY
    int r = blockIdx.x;
    const float* s = x + (u64)gtok[r] * e;
    for (int j = threadIdx.x; j < e; j += blockDim.x) out[(u64)r * e + j] = s[j];
}

extern "C" __global__ void scale_inplace(float* x, u64 n, float s) { PDL_ENTRY
    u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] *= s;
}
