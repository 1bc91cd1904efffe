
// ---- Persistent, software-pipelined split-layout Q8_0 · Q8_0 decode mat-vec ("q8p") ----
// The per-row sums of mvq8_q8s_n1: the lane of part p that takes block 32 st + m (st = p, p + ks, ..)
// adds (float)s * (h2f(dw) * dx) in block order (s: the block's exact integer dot), the lanes are
// summed in mvq8_q8s_n1's butterfly order, then the ks parts in part order. So for the same ks the
// results are bit-identical; only the schedule differs:
// - a task is one of mvq8_q8s_n1's blocks (8 / ks row groups of R rows, ks warps each); at most
//   SMs x 2 blocks walk the tasks (t, t + gridDim.x, ..), as many each: no waves, no block tails;
//   task t is slot t % nz of row group t / nz (the slots of a row group together: slots sharing a
//   matrix, a verify step's rows, read it from L2 after the first);
// - a warp's steps form one stream across its tasks, and the weights of the next step are requested
//   before the current step's arithmetic (two register sets, so R = 4 rows fit 128 registers), so a
//   warp has a step in flight while it waits, computes or reduces;
// - R is 4, or 2 / 1 for matrices with too few rows to give every SM work at R = 4;
// - weights are read once: coalesced 16-byte loads without L1 allocation (activations stay in L1).

// Read-once weight loads: read-only path, no L1 line allocated.
__device__ __forceinline__ uint4 q8p_ld16(const u8* p) {
    uint4 v;
    asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    return v;
}
__device__ __forceinline__ u16 q8p_ld2(const u8* p) {
    u16 v;
    asm("ld.global.nc.L1::no_allocate.u16 %0, [%1];" : "=h"(v) : "l"(p));
    return v;
}

// One step's weights for R rows: the lane's block payload (2 x 16 bytes) and f16 scale per row.
template <int R> struct Q8pBuf {
    uint4 w0[R], w1[R];
    u16 d[R];
};

// The activations of step block b0 for row z (lane's halves of blocks k and 16 + k; its own block's scale).
__device__ __forceinline__ void q8p_load_x(const signed char* __restrict__ XQ, const float* __restrict__ XD, int xq_z, int z, int b0, int nb,
                                           int lane, int kb, int lb, int4& x0, int4& x1, float& dx) {
    x0 = make_int4(0, 0, 0, 0);
    x1 = x0;
    dx = 0.0f;
    const signed char* xq = XQ + (u64)z * xq_z + 32 * b0 + 16 * lane;
    if (b0 + kb < nb) x0 = __ldg((const int4*)xq);
    if (b0 + 16 + kb < nb) x1 = __ldg((const int4*)(xq + 512));
    if (b0 + lb < nb) dx = __ldg(XD + (u64)z * (xq_z >> 5) + b0 + lb);
}

// The block's exact integer dot for row r of `c`: this lane's half plus its partner's (exact in any order).
template <int R>
__device__ __forceinline__ int q8p_dot(const Q8pBuf<R>& c, int r, int4 x0, int4 x1, int h) {
    int p0 = __dp4a((int)c.w0[r].x, x0.x, 0);
    p0 = __dp4a((int)c.w0[r].y, x0.y, p0);
    p0 = __dp4a((int)c.w0[r].z, x0.z, p0);
    p0 = __dp4a((int)c.w0[r].w, x0.w, p0);
    int p1 = __dp4a((int)c.w1[r].x, x1.x, 0);
    p1 = __dp4a((int)c.w1[r].y, x1.y, p1);
    p1 = __dp4a((int)c.w1[r].z, x1.z, p1);
    p1 = __dp4a((int)c.w1[r].w, x1.w, p1);
    return (h ? p1 : p0) + __shfl_xor_sync(0xffffffffu, h ? p0 : p1, 1);
}

template <int R>
__device__ __forceinline__ void mvq8_q8p(const u8* __restrict__ W, u64 w_mat_bytes, const int* __restrict__ eids, const signed char* __restrict__ XQ,
                                         const float* __restrict__ XD, int xq_z, float* __restrict__ Y, int y_z, int rows, int cols, int ks, int nz) {
    PDL_TRIGGER
    __shared__ float red[2][8][R];
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, part = wid % ks, grp = wid / ks;
    const int rpt = (8 / ks) * R;  // rows per task
    const int tpz = (rows + rpt - 1) / rpt, ntasks = tpz * nz;
    const int nb = cols >> 5, nsteps = (nb + 31) >> 5;
    const u64 rb = (u64)nb * 34;
    // Steps of this warp per task; one empty step where ks > nsteps, so the warp still joins the sums.
    const int nsp = part < nsteps ? (nsteps - 1 - part) / ks + 1 : 1;
    // Expert ids come from the previous kernel; plain slots let the first weight loads overlap its tail.
    if (eids) { PDL_WAIT }

    // Lane l = 2k + h loads half h of blocks k and 16 + k of the step (each load a contiguous 512
    // bytes) and adds up block k (h = 0) or 16 + k (h = 1) with its partner: lane l takes the block
    // that lane k + 16 h of mvq8_q8s_n1 takes.
    const int h = lane & 1, kb = lane >> 1, lb = kb + 16 * h;
    auto fetch = [&](Q8pBuf<R>& f, int t, int j) {
        int z = t % nz, r0 = (t / nz) * rpt + grp * R, b0 = (part + j * ks) * 32;
        if (b0 >= nb) return;
        const u8* wm = W + (u64)(eids ? eids[z] : z) * w_mat_bytes;
#pragma unroll
        for (int r = 0; r < R; r++) {
            const u8* wr = wm + (u64)min(r0 + r, rows - 1) * rb;  // rows past the end repeat the last
            if (b0 + kb < nb) f.w0[r] = q8p_ld16(wr + 32 * b0 + 16 * lane);
            if (b0 + 16 + kb < nb) f.w1[r] = q8p_ld16(wr + 32 * b0 + 512 + 16 * lane);
            if (b0 + lb < nb) f.d[r] = q8p_ld2(wr + cols + 2 * (b0 + lb));
        }
    };

    float acc[R];
#pragma unroll
    for (int r = 0; r < R; r++) acc[r] = 0.0f;
    int k = 0;  // tasks this block has finished: the parity picks the `red` buffer
    // Step j of task t from `c`; after the task's last step, its rows are summed and stored.
    auto step = [&](const Q8pBuf<R>& c, int t, int j) {
        int z = t % nz, r0 = (t / nz) * rpt + grp * R, b0 = (part + j * ks) * 32;
        if (b0 < nb) {
            int4 x0, x1;
            float dx;
            bool own = b0 + lb < nb;
            q8p_load_x(XQ, XD, xq_z, z, b0, nb, lane, kb, lb, x0, x1, dx);
#pragma unroll
            for (int r = 0; r < R; r++) {
                int s = q8p_dot(c, r, x0, x1, h);
                if (own) acc[r] += (float)s * (h2f(c.d[r]) * dx);
            }
        }
        if (j != nsp - 1) return;
        float* y = Y + (u64)z * y_z;
        // Lane m sums what lane m of mvq8_q8s_n1 holds (same butterfly order): lane 2m, or 2m - 31.
        int src = lane < 16 ? 2 * lane : 2 * lane - 31;
        if (ks == 1) {
            float v = 0.0f;
#pragma unroll
            for (int r = 0; r < R; r++) {
                float s = warp_sum(__shfl_sync(0xffffffffu, acc[r], src));
                if (lane == r) v = s;
                acc[r] = 0.0f;
            }
            if (lane < R && r0 + lane < rows) y[r0 + lane] = 0.0f + v;  // 0 + v: as mvq_store
        } else {
#pragma unroll
            for (int r = 0; r < R; r++) {
                float s = warp_sum(__shfl_sync(0xffffffffu, acc[r], src));
                if (lane == 0) red[k & 1][wid][r] = s;
                acc[r] = 0.0f;
            }
            // Only the ks warps of this row group meet (named barrier 1 + grp). Two buffers: a warp
            // writes this one again two tasks on, after part 0 has read it (it passed the next barrier).
            asm volatile("bar.sync %0, %1;" ::"r"(grp + 1), "r"(ks * 32) : "memory");
            if (part == 0 && lane < R && r0 + lane < rows) {
                float v = 0.0f;
                for (int p = 0; p < ks; p++) v += red[k & 1][wid + p][lane];
                y[r0 + lane] = v;
            }
        }
        k++;
    };

    // The warp's steps in order: (t, j) computed, (tn, jn) fetched one step ahead into the other set.
    auto advance = [&](int& t, int& j) {
        if (++j == nsp) { j = 0; t += gridDim.x; }
    };
    Q8pBuf<R> A, B;
    int t = blockIdx.x, j = 0, tn = t, jn = 0;
    if (t < ntasks) fetch(A, t, 0);
    PDL_WAIT  // before the activations are read and (all threads) before Y is written
    advance(tn, jn);
    while (t < ntasks) {
        if (tn < ntasks) fetch(B, tn, jn);
        advance(tn, jn);
        step(A, t, j);
        advance(t, j);
        if (t >= ntasks) break;
        if (tn < ntasks) fetch(A, tn, jn);
        advance(tn, jn);
        step(B, t, j);
        advance(t, j);
    }
}

#define Q8P_ARGS const u8* __restrict__ W, u64 w_mat_bytes, const int* __restrict__ eids, const signed char* __restrict__ XQ, \
    const float* __restrict__ XD, int xq_z, float* __restrict__ Y, int y_z, int rows, int cols, int ks, int nz
#define Q8P_CALL W, w_mat_bytes, eids, XQ, XD, xq_z, Y, y_z, rows, cols, ks, nz

// ---- Several activation rows through one matrix ("q8m": a verify step's rows, a batch's sessions) ----
// mvq8_q8p's sums for each of nz (<= Q8M_Z) activation rows, with each step's weights loaded once for
// all of them: a task is one row group (no slot in the task index), and each lane adds its block of
// the step for every row in turn. Per row: the same lane takes the same blocks in the same order, the
// same butterfly, the same part order, so every row's result is bit-identical to its own one-row
// product for the same ks; only the weight traffic is shared.
#define Q8M_Z 8
template <int R>
__device__ __forceinline__ void mvq8_q8m(const u8* __restrict__ W, const signed char* __restrict__ XQ, const float* __restrict__ XD, int xq_z,
                                         float* __restrict__ Y, int y_z, int rows, int cols, int ks, int nz) {
    PDL_TRIGGER
    __shared__ float red[2][8][Q8M_Z][R];
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, part = wid % ks, grp = wid / ks;
    const int rpt = (8 / ks) * R;  // rows per task
    const int ntasks = (rows + rpt - 1) / rpt;
    const int nb = cols >> 5, nsteps = (nb + 31) >> 5;
    const u64 rb = (u64)nb * 34;
    const int nsp = part < nsteps ? (nsteps - 1 - part) / ks + 1 : 1;
    const int h = lane & 1, kb = lane >> 1, lb = kb + 16 * h;
    auto fetch = [&](Q8pBuf<R>& f, int t, int j) {
        int r0 = t * rpt + grp * R, b0 = (part + j * ks) * 32;
        if (b0 >= nb) return;
#pragma unroll
        for (int r = 0; r < R; r++) {
            const u8* wr = W + (u64)min(r0 + r, rows - 1) * rb;
            if (b0 + kb < nb) f.w0[r] = q8p_ld16(wr + 32 * b0 + 16 * lane);
            if (b0 + 16 + kb < nb) f.w1[r] = q8p_ld16(wr + 32 * b0 + 512 + 16 * lane);
            if (b0 + lb < nb) f.d[r] = q8p_ld2(wr + cols + 2 * (b0 + lb));
        }
    };
    float acc[Q8M_Z][R];
#pragma unroll
    for (int z = 0; z < Q8M_Z; z++)
#pragma unroll
        for (int r = 0; r < R; r++) acc[z][r] = 0.0f;
    int k = 0;
    auto step = [&](const Q8pBuf<R>& c, int t, int j) {
        int r0 = t * rpt + grp * R, b0 = (part + j * ks) * 32;
        if (b0 < nb) {
            bool own = b0 + lb < nb;
#pragma unroll
            for (int z = 0; z < Q8M_Z; z++) {
                if (z >= nz) break;
                int4 x0, x1;
                float dx;
                q8p_load_x(XQ, XD, xq_z, z, b0, nb, lane, kb, lb, x0, x1, dx);
#pragma unroll
                for (int r = 0; r < R; r++) {
                    int s = q8p_dot(c, r, x0, x1, h);
                    if (own) acc[z][r] += (float)s * (h2f(c.d[r]) * dx);
                }
            }
        }
        if (j != nsp - 1) return;
        int src = lane < 16 ? 2 * lane : 2 * lane - 31;
#pragma unroll
        for (int z = 0; z < Q8M_Z; z++) {
            if (z >= nz) break;
            float* y = Y + (u64)z * y_z;
            float v = 0.0f;
#pragma unroll
            for (int r = 0; r < R; r++) {
                float s = warp_sum(__shfl_sync(0xffffffffu, acc[z][r], src));
                if (ks == 1) {
                    if (lane == r) v = s;
                } else if (lane == 0) {
                    red[k & 1][wid][z][r] = s;
                }
                acc[z][r] = 0.0f;
            }
            if (ks == 1 && lane < R && r0 + lane < rows) y[r0 + lane] = 0.0f + v;  // 0 + v: as mvq_store
        }
        if (ks > 1) {
            asm volatile("bar.sync %0, %1;" ::"r"(grp + 1), "r"(ks * 32) : "memory");
            if (part == 0 && lane < R && r0 + lane < rows) {
                for (int z = 0; z < nz; z++) {
                    float v = 0.0f;
                    for (int p = 0; p < ks; p++) v += red[k & 1][wid + p][z][lane];
                    Y[(u64)z * y_z + r0 + lane] = v;
                }
            }
        }
        k++;
    };
    auto advance = [&](int& t, int& j) {
        if (++j == nsp) { j = 0; t += gridDim.x; }
    };
    Q8pBuf<R> A, B;
    int t = blockIdx.x, j = 0, tn = t, jn = 0;
    if (t < ntasks) fetch(A, t, 0);
    PDL_WAIT
    advance(tn, jn);
    while (t < ntasks) {
        if (tn < ntasks) fetch(B, tn, jn);
        advance(tn, jn);
        step(A, t, j);
        advance(t, j);
        if (t >= ntasks) break;
        if (tn < ntasks) fetch(A, tn, jn);
        advance(tn, jn);
        step(B, t, j);
        advance(t, j);
    }
}
#define Q8M_ARGS const u8* __restrict__ W, const signed char* __restrict__ XQ, const float* __restrict__ XD, int xq_z, float* __restrict__ Y, \
    int y_z, int rows, int cols, int ks, int nz
#define Q8M_CALL W, XQ, XD, xq_z, Y, y_z, rows, cols, ks, nz
