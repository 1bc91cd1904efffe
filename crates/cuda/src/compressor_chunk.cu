
// ---------------------------------------------------------------------------------------------
// Compressor over a prefill chunk, in parallel (comp_seq walks positions one by one, which decode
// keeps). A window's pooled row depends only on the entries of its own positions (ratio 4: also the
// previous window's), each either in the chunk or, before pos0, in the frontier state; so every
// (window, channel) is independent. Each sums its entries in the order comp_seq does, so results are
// bit-identical. comp_state then leaves the frontier state as the sequential walk would.
// Ratio 4 (overlapping windows, w = 2d): state rows 0..3 = the last closed window's entries, rows
// 4+slot = the open window's; rows < 4 are read at channel j, rows >= 4 at channel d + j.
// ---------------------------------------------------------------------------------------------
__device__ __forceinline__ void comp_entry(const float* __restrict__ kvp, const float* __restrict__ gp, const float* __restrict__ ape,
                                           const float* __restrict__ st_kv, const float* __restrict__ st_sc, long long p, long long pos0,
                                           int ratio, int w, int ch, float* kv, float* sc) {
    if (p < 0) {
        *kv = 0.0f;
        *sc = -INFINITY;
        return;
    }
    int slot = (int)(p % ratio);
    if (p >= pos0) {
        u64 i = (u64)(p - pos0);
        *kv = kvp[i * w + ch];
        *sc = gp[i * w + ch] + ape[slot * w + ch];
        return;
    }
    int row = (ratio == 4 && p / 4 == pos0 / 4) ? 4 + slot : slot;
    *kv = st_kv[row * w + ch];
    *sc = st_sc[row * w + ch];
}

// Grid (windows closing in the chunk, ceil(d / blockDim.x)); window k is number pos0 / ratio + k.
extern "C" __global__ void comp_pool(const float* kvp, const float* gp, const float* ape, const float* st_kv, const float* st_sc, float* pooled,
                                     long long pos0, int ratio, int w, int d) { PDL_ENTRY
    int k = blockIdx.x, j = blockIdx.y * blockDim.x + threadIdx.x;
    if (j >= d) return;
    long long pend = (pos0 / ratio + k + 1) * ratio - 1;
    int nrow = ratio == 4 ? 8 : ratio;
    long long pfirst = pend + 1 - nrow;
    float m = -INFINITY;
    for (int c = 0; c < nrow; c++) {
        int ch = (ratio == 4 && c >= 4) ? d + j : j;
        float kv, sc;
        comp_entry(kvp, gp, ape, st_kv, st_sc, pfirst + c, pos0, ratio, w, ch, &kv, &sc);
        m = fmaxf(m, sc);
    }
    float out = 0.0f;
    if (m != -INFINITY) {
        float den = 0.0f, num = 0.0f;
        for (int c = 0; c < nrow; c++) {
            int ch = (ratio == 4 && c >= 4) ? d + j : j;
            float kv, sc;
            comp_entry(kvp, gp, ape, st_kv, st_sc, pfirst + c, pos0, ratio, w, ch, &kv, &sc);
            float e = expf(sc - m);
            den += e;
            num += e * kv;
        }
        out = num / den;
    }
    pooled[(u64)k * d + j] = out;
}

// Frontier state after the chunk (thread per channel of w): ratio 4 first copies the last window
// closed in the chunk to rows 0..3 (reading the old open-window rows it needs before they change);
// then each slot's row takes the chunk's latest position of that slot.
extern "C" __global__ void comp_state(const float* kvp, const float* gp, const float* ape, float* st_kv, float* st_sc, int n, long long pos0, int ratio, int w) { PDL_ENTRY
    int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= w) return;
    long long pl = pos0 + n - 1;
    if (ratio == 4) {
        long long pc = ((pl + 1) / 4) * 4 - 1;
        if (pc >= pos0) {
            float kv[4], sc[4];
            for (int c = 0; c < 4; c++) {
                long long p = pc - 3 + c;
                if (p >= pos0) {
                    u64 i = (u64)(p - pos0);
                    kv[c] = kvp[i * w + j];
                    sc[c] = gp[i * w + j] + ape[c * w + j];
                } else {
                    kv[c] = st_kv[(4 + c) * w + j];
                    sc[c] = st_sc[(4 + c) * w + j];
                }
            }
            for (int c = 0; c < 4; c++) {
                st_kv[c * w + j] = kv[c];
                st_sc[c * w + j] = sc[c];
            }
        }
    }
    for (int s = 0; s < ratio; s++) {
        long long p = pl - (((pl - s) % ratio) + ratio) % ratio;
        if (p < pos0) continue;
        u64 i = (u64)(p - pos0);
        int row = ratio == 4 ? 4 + s : s;
        st_kv[row * w + j] = kvp[i * w + j];
        st_sc[row * w + j] = gp[i * w + j] + ape[s * w + j];
    }
}
