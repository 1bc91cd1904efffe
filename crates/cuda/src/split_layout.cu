// In-place conversion of rows of `nb` blocks (`bs` bytes each, a 2-byte f16 scale first) to the split
// layout: the nb payloads of bs-2 bytes, then the nb scales. One block per row; row in shared memory.
extern "C" __global__ void split_rows(u8* W, int nb, int bs) { PDL_ENTRY
    extern __shared__ u8 rowbuf[];
    u8* row = W + (u64)blockIdx.x * nb * bs;
    int rb = nb * bs, pb = bs - 2;
    for (int k = threadIdx.x; k < rb; k += blockDim.x) rowbuf[k] = row[k];
    __syncthreads();
    for (int k = threadIdx.x; k < rb; k += blockDim.x) {
        int blk = k / bs, off = k % bs;
        if (off < 2) row[nb * pb + 2 * blk + off] = rowbuf[k];
        else row[blk * pb + off - 2] = rowbuf[k];
    }
}

// f16 copies of split-layout Q8_0 / IQ2_XXS matrices (`n` elements, rows of `cols`).
extern "C" __global__ void dq_q8s(const u8* W, u16* out, u64 n, int cols) { PDL_ENTRY
    u64 u = (u64)blockIdx.x * blockDim.x + threadIdx.x;  // unit = 8 elements, one 16-byte store
    if (u * 8 >= n) return;
    u64 row = (u * 8) / cols;
    int e0 = (int)((u * 8) % cols);
    const u8* wr = W + row * (u64)(cols >> 5) * 34;
    float d = h2f(ld16(wr + cols + 2 * (e0 >> 5)));
    u32 q0 = *(const u32*)(wr + e0), q1 = *(const u32*)(wr + e0 + 4);
    u32 o[4];
    for (int k = 0; k < 4; k++) {
        u32 qq = k < 2 ? q0 : q1;
        int sh = (k & 1) * 16;
        o[k] = (u32)f2h(d * (float)(signed char)(qq >> sh)) | ((u32)f2h(d * (float)(signed char)(qq >> (sh + 8))) << 16);
    }
    *(uint4*)(out + u * 8) = make_uint4(o[0], o[1], o[2], o[3]);
}
extern "C" __global__ void dq_iq2s(const u8* W, u16* out, u64 n, int cols) { PDL_ENTRY
    u64 u = (u64)blockIdx.x * blockDim.x + threadIdx.x;  // unit = (block, group, l) -> 8 elements
    if (u * 8 >= n) return;
    int nb = cols >> 8;
    u64 ibg = u >> 5;
    u64 row = ibg / nb;
    int ib = (int)(ibg % nb);
    int g = (u >> 2) & 7, l = u & 3;
    const u8* wr = W + row * (u64)nb * 66;
    float d = h2f(ld16(wr + nb * 64 + 2 * ib));
    const u8* qs = wr + 64 * ib + 8 * g;
    u32 a0 = *(const u32*)qs, a1 = *(const u32*)(qs + 4);
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
    *(uint4*)(out + ibg * 256 + 32 * g + 8 * l) = make_uint4(o[0], o[1], o[2], o[3]);
}

