// ---------------------------------------------------------------------------------------------
// Compressor: one block of `w` threads (channel j) walks the step's positions in order, updates
// the frontier state and pools the window closing at position i into row i of `pooled` (d wide).
// With `snap` (a verify step's rows, ratio 4): the whole frontier after position i is copied to
// snap + 16 w i (kv rows, then score rows), so a rollback to any row can restore it (stage/undo.rs).
// ---------------------------------------------------------------------------------------------
// Thread j's channel of the ratio-4 frontier (8 rows: the previous window and this one) into snap.
__device__ __forceinline__ void save_frontier(float* snap, const float* st_kv, const float* st_sc, int ratio, int w, int i, int j) {
    if (!snap || ratio != 4 || j >= w) return;
    float* s = snap + (u64)16 * w * i;
#pragma unroll 1
    for (int c = 0; c < 8; c++) {
        s[c * w + j] = st_kv[c * w + j];
        s[(8 + c) * w + j] = st_sc[c * w + j];
    }
}

// Up to 1024 threads (w = 2 x 512 at Flash's ratio-4 layers): registers capped to fit the block.
extern "C" __global__ void __launch_bounds__(1024) comp_seq(const float* kvp, const float* gp, const float* ape, float* st_kv, float* st_sc, float* pooled,
                                    int n, long long pos0, int ratio, int w, int d, const long long* dpos, float* snap) { PDL_ENTRY
    if (dpos) pos0 = *dpos;
    int j = threadIdx.x;
    for (int i = 0; i < n; i++) {
        long long pos = pos0 + i;
        int slot = (int)(pos % ratio);
        int row = ratio == 4 ? ratio + slot : slot;
        if (j < w) {
            st_kv[row * w + j] = kvp[(u64)i * w + j];
            st_sc[row * w + j] = gp[(u64)i * w + j] + ape[slot * w + j];
        }
        if ((pos + 1) % ratio != 0) {
            save_frontier(snap, st_kv, st_sc, ratio, w, i, j);
            continue;
        }
        __syncthreads();
        if (j < d) {
            float m = -INFINITY;
            int nrow = ratio == 4 ? 8 : ratio;
            for (int c = 0; c < nrow; c++) {
                int ch = (ratio == 4 && c >= 4) ? d + j : j;
                m = fmaxf(m, st_sc[c * w + ch]);
            }
            float out = 0.0f;
            if (m != -INFINITY) {
                float den = 0.0f, num = 0.0f;
                for (int c = 0; c < nrow; c++) {
                    int ch = (ratio == 4 && c >= 4) ? d + j : j;
                    float e = expf(st_sc[c * w + ch] - m);
                    den += e;
                    num += e * st_kv[c * w + ch];
                }
                out = num / den;
            }
            pooled[(u64)i * d + j] = out;
        }
        __syncthreads();
        if (ratio == 4 && j < w) {
            for (int c = 0; c < 4; c++) {
                st_kv[c * w + j] = st_kv[(4 + c) * w + j];
                st_sc[c * w + j] = st_sc[(4 + c) * w + j];
            }
        }
        __syncthreads();
        save_frontier(snap, st_kv, st_sc, ratio, w, i, j);
    }
}

// Resets compressor state scores to -inf (kv to 0).
extern "C" __global__ void comp_reset(float* st_kv, float* st_sc, int len) { PDL_ENTRY
    int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j < len) { st_kv[j] = 0.0f; st_sc[j] = -INFINITY; }
}

