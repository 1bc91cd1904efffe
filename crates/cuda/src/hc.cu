// ---------------------------------------------------------------------------------------------
// Hyper-connections.
// ---------------------------------------------------------------------------------------------
// Fused sub-layer entry for decode and prefill: from the raw mix projection of the un-normalised
// streams (x·Wᵀ), the flat RMS factor, pre/post weights, the collapsed input cur = Σ pre[s]·X[s], and
// its RMS norm with weight `w` into `xn`. One block per token (replaces rms + hc_pre + rms). The
// Sinkhorn matrix is left out (only the sub-layer's output step, hc_post, needs it): decode computes
// it with `hc_comb` on a side stream; with `comb` (prefill) the flat RMS factor is kept in the
// matrix's first slot for `hc_comb_rows`, a warp a token (in this block, one warp's serial Sinkhorn
// held the other 31 at the barrier).
extern "C" __global__ void __launch_bounds__(1024) hc_pre_norm(const float* mixraw, const float* scale, const float* base, int nh, int iters,
                                                              float hc_eps, const float* x, int e, float* mixes, const float* w, float eps,
                                                              float* xn, int comb) { PDL_ENTRY
    __shared__ double red[32];
    __shared__ float pre[16];
    __shared__ float s_inv;
    extern __shared__ float curs[];  // e floats
    int i = blockIdx.x, t = threadIdx.x;
    int hd = nh * e, nm = (2 + nh) * nh;
    const float* xi = x + (u64)i * hd;
    double ss = block_sum_d(sumsq_part(xi, hd), red);
    float inv = 1.0f / sqrtf((float)(ss / hd) + eps);
    const float* mr = mixraw + (u64)i * nm;
    float* mo = mixes + (u64)i * (nh + nh * nh);
    if (t < nh) {
        pre[t] = sigmoidf_(mr[t] * inv * scale[0] + base[t]) + hc_eps;
        mo[t] = 2.0f * sigmoidf_(mr[nh + t] * inv * scale[1] + base[nh + t]);
    }
    if (comb && t == 0) mo[nh] = inv;
    __syncthreads();
    double s2 = block_sum_d(hc_collapse(xi, pre, nh, e, curs), red);
    if (t == 0) s_inv = 1.0f / sqrtf((float)(s2 / e) + eps);
    __syncthreads();
    float inv2 = s_inv;
    for (int j = t; j < e; j += blockDim.x) xn[(u64)i * e + j] = w ? curs[j] * inv2 * w[j] : curs[j] * inv2;
}

// The Sinkhorn matrix alone (decode, on a side stream). One block of 1024 threads per token.
extern "C" __global__ void __launch_bounds__(1024) hc_comb(const float* mixraw, const float* scale, const float* base, int nh, int iters, float hc_eps,
                                                          const float* x, int e, float* mixes, float eps) { PDL_ENTRY
    __shared__ double red[32];
    int i = blockIdx.x, t = threadIdx.x;
    int hd = nh * e, nm = (2 + nh) * nh;
    const float* xi = x + (u64)i * hd;
    double ss = block_sum_d(sumsq_part(xi, hd), red);
    float inv = 1.0f / sqrtf((float)(ss / hd) + eps);
    if (t < 32) hc_comb_warp(mixraw + (u64)i * nm, inv, scale, base, nh, iters, hc_eps, mixes + (u64)i * (nh + nh * nh));
}

// The Sinkhorn matrices of n tokens, a warp each, from the flat RMS factor hc_pre_norm kept (comb):
// the warp computation of the fused entries, so the matrices are the same bits. 256 threads a block.
extern "C" __global__ void hc_comb_rows(const float* mixraw, const float* scale, const float* base, int nh, int iters, float hc_eps, float* mixes, int n) { PDL_ENTRY
    int i = blockIdx.x * 8 + (threadIdx.x >> 5);
    if (i >= n) return;  // whole warps
    float* mo = mixes + (u64)i * (nh + nh * nh);
    float inv = mo[nh];
    __syncwarp();
    hc_comb_warp(mixraw + (u64)i * (2 + nh) * nh, inv, scale, base, nh, iters, hc_eps, mo);
}

// X'[c] = post[c]*y + sum_r comb[r][c]*X[r], in place. Grid: (ceil(e/256), n).
extern "C" __global__ void hc_post(const float* mixes, int nh, const float* y, float* x, int e) { PDL_ENTRY
    int i = blockIdx.y, j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= e) return;
    const float* mo = mixes + (u64)i * (nh + nh * nh);
    float* xi = x + (u64)i * nh * e;
    float old[16];
    for (int r = 0; r < nh; r++) old[r] = xi[r * e + j];
    float yv = y[(u64)i * e + j];
    // Rounding spelled out (no contraction left to the compiler): hc_entry_dec folds the same exit.
    for (int c = 0; c < nh; c++) {
        float acc = __fmul_rn(mo[c], yv);
        for (int r = 0; r < nh; r++) acc = __fmaf_rn(mo[nh + r * nh + c], old[r], acc);
        xi[c * e + j] = acc;
    }
}

// Output-head collapse: w[s] = sigmoid(m[s]*scale + base[s]) + eps; out = sum w[s] X[s].
extern "C" __global__ void head_collapse(const float* mix, const float* scale, const float* base, float eps, const float* x, int nh, int e, float* out) { PDL_ENTRY
    // Grid (rows, column slices), as embed.
    int i = blockIdx.x;
    for (int j = blockIdx.y * blockDim.x + threadIdx.x; j < e; j += gridDim.y * blockDim.x) {
        float o = 0.0f;
        for (int s = 0; s < nh; s++) {
            float w = sigmoidf_(mix[i * nh + s] * scale[0] + base[s]) + eps;
            o += w * x[(u64)i * nh * e + s * e + j];
        }
        out[(u64)i * e + j] = o;
    }
}

