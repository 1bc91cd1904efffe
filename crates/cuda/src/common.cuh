// DwarfStar CUDA kernels (compiled at start-up by NVRTC to a CUBIN for the device's architecture).
// Layout conventions match the CPU backend (crates/model): activations are f32, token-major
// (row i of a batch is token i); a weight matrix is `rows` rows of `cols` elements in GGML block format.
// No headers: f16 conversions use PTX cvt.

typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;
#define INFINITY __int_as_float(0x7f800000)

// Programmatic dependent launch (launches carry the stream-serialization attribute when enabled):
// every kernel lets the next one be scheduled at once and then waits for its predecessor's
// results, so the launch latency and ramp of kernel N+1 overlap kernel N's tail. Both are no-ops
// for a launch without the attribute.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define PDL_TRIGGER asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#define PDL_WAIT asm volatile("griddepcontrol.wait;" ::: "memory");
#else
#define PDL_TRIGGER
#define PDL_WAIT
#endif
#define PDL_ENTRY PDL_TRIGGER PDL_WAIT

__device__ u64 iq2xxs_grid[256];

__device__ __forceinline__ float h2f(u16 h) { float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h)); return f; }
__device__ __forceinline__ u16 f2h(float f) { u16 h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h; }
__device__ __forceinline__ float bf2f(u16 h) { return __uint_as_float(((u32)h) << 16); }
__device__ __forceinline__ u16 ld16(const u8* p) { return *(const u16*)p; }
__device__ __forceinline__ u32 ld32u(const u8* p) { return (u32)ld16(p) | ((u32)ld16(p + 2) << 16); }

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
// send = m ? lo : hi and keep the other, in inline PTX: a select on the array elements themselves is
// compiled to an indexed load, which puts the array in local memory.
__device__ __forceinline__ void pick(float lo, float hi, u32 m, float& send, float& keep) {
    asm("{\n\t.reg .pred p;\n\tsetp.ne.u32 p, %4, 0;\n\tselp.f32 %0, %2, %3, p;\n\tselp.f32 %1, %3, %2, p;\n\t}"
        : "=f"(send), "=f"(keep) : "f"(lo), "f"(hi), "r"(m));
}
// One butterfly step over the first 2H values: a lane keeps the half of them its partner (lane ^ O)
// does not keep and adds the partner's copy of that half (H shuffles).
template <int O, int H> __device__ __forceinline__ void halve(float* a, int lane) {
    u32 m = lane & O ? ~0u : 0u;
#pragma unroll
    for (int i = 0; i < H; i++) {
        float send, keep;
        pick(a[i], a[i + H], m, send, keep);
        a[i] = keep + __shfl_xor_sync(0xffffffffu, send, O);
    }
}
// Warp sums of N (32 or 16) values at once: lane l ends with the warp's sum of a[l * N / 32]
// (N - 1 shuffles, plus one for N = 16, instead of N x 5). The same sums in every lane order as one
// tree a value would give in its own lanes.
template <int N> __device__ __forceinline__ float warp_sum_scatter(float* a) {
    int lane = threadIdx.x & 31;
    halve<16, N / 2>(a, lane);
    halve<8, N / 4>(a, lane);
    halve<4, N / 8>(a, lane);
    halve<2, N / 16>(a, lane);
    if constexpr (N == 32) {
        halve<1, 1>(a, lane);
        return a[0];
    } else {
        return a[0] + __shfl_xor_sync(0xffffffffu, a[0], 1);
    }
}
__device__ __forceinline__ double warp_sum_d(double v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// Block-wide sum (blockDim.x multiple of 32, <= 1024). `red` holds 32 doubles.
__device__ double block_sum_d(double v, double* red) {
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_sum_d(v);
    __syncthreads();
    if (lane == 0) red[w] = v;
    __syncthreads();
    double s = 0.0;
    for (int i = 0; i < nw; i++) s += red[i];
    return s;
}

// This thread's part of sum(x[j]^2) in double over j = threadIdx.x, +blockDim.x, .. < n (that order),
// with eight loads in flight at a time (a plain loop waited on each load in turn: ~0.5 us a step).
__device__ __forceinline__ double sumsq_part(const float* __restrict__ x, int n) {
    double ss = 0.0;
    for (int j0 = threadIdx.x; j0 < n; j0 += 8 * blockDim.x) {
        float v[8];
#pragma unroll
        for (int u = 0; u < 8; u++) {
            int j = j0 + u * blockDim.x;
            v[u] = j < n ? x[j] : 0.0f;
        }
#pragma unroll
        for (int u = 0; u < 8; u++)
            if (j0 + u * blockDim.x < n) ss += (double)v[u] * (double)v[u];
    }
    return ss;
}

// ---- int8 activation copies written by the kernels that produce the activations ----
// Q8_0 copy of the 32 values a warp holds (lane L: value v at index j, j - L aligned to 32), as
// q80_quant / the CPU's quantize_row_q8_0: d = amax / 127, q = round-half-away(v / d), scale kept as
// the f16 the CPU stores. Every lane of the warp must call it.
__device__ __forceinline__ void q80_warp(float v, u64 j, signed char* Q, float* D) {
    float amax = warp_max(fabsf(v));
    float d = amax / 127.0f;
    float id = d != 0.0f ? 1.0f / d : 0.0f;
    Q[j] = (signed char)(int)roundf(v * id);
    if ((threadIdx.x & 31) == 0) D[j >> 5] = h2f(f2h(d));
}

// Q8_K copy of the 256 values held by 8 consecutive warps (thread g = threadIdx.x % 256 holds value v
// of block `blk`), as q8k_quant / the CPU's quantize_row_q8_k: the scale comes from the value of
// largest magnitude, the first on ties. The key orders by magnitude, then by lower index; its last
// bit keeps the sign. Every thread of the block must call it (it synchronises; `on` = false: the
// thread's group holds no block this pass, nothing is stored); `red` holds blockDim.x / 32 keys.
__device__ __forceinline__ u64 q8k_key(float v, int g) {
    return ((u64)__float_as_uint(fabsf(v)) << 32) | ((u32)(255 - g) << 1) | (v < 0.0f ? 1u : 0u);
}
__device__ __forceinline__ u64 warp_max_u64(u64 key) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        u64 k2 = __shfl_xor_sync(0xffffffffu, key, o);
        key = k2 > key ? k2 : key;
    }
    return key;
}
// Stores value g of Q8_K block `blk` given the block's largest key `k`.
__device__ __forceinline__ void q8k_store(float v, u64 k, u64 blk, int g, signed char* Q, float* D) {
    float a = __uint_as_float((u32)(k >> 32));
    float m = (k & 1) ? -a : a;
    if (m == 0.0f) {
        Q[blk * 256 + g] = 0;
        if (g == 0) D[blk] = 0.0f;
        return;
    }
    float iscale = -127.0f / m;
    Q[blk * 256 + g] = (signed char)min((int)rintf(iscale * v), 127);
    if (g == 0) D[blk] = 1.0f / iscale;
}
__device__ __forceinline__ void q8k_group(float v, u64 blk, bool on, signed char* Q, float* D, u64* red) {
    int g = threadIdx.x & 255, lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    u64 key = warp_max_u64(q8k_key(v, g));
    __syncthreads();
    if (lane == 0) red[w] = key;
    __syncthreads();
    u64 k = red[w & ~7];
#pragma unroll
    for (int i = 1; i < 8; i++) k = red[(w & ~7) + i] > k ? red[(w & ~7) + i] : k;
    if (on) q8k_store(v, k, blk, g, Q, D);
}

__device__ __forceinline__ float sigmoidf_(float x) { return 1.0f / (1.0f + expf(-x)); }
__device__ __forceinline__ float siluf_(float x) { return x * sigmoidf_(x); }
__device__ __forceinline__ float softplusf_(float x) { return x > 20.0f ? x : log1pf(expf(x)); }


// GGML block helpers: the 6-bit scale and min j of a Q4_K superblock's 12 scale bytes `s`; an
// IQ2_XXS 7-bit sign field with its parity as bit 7.
__device__ __forceinline__ void q4k_sm(int j, const u8* s, int* sc, int* m) {
    if (j < 4) { *sc = s[j] & 63; *m = s[j + 4] & 63; }
    else { *sc = (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4); *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4); }
}
__device__ __forceinline__ u32 ksign(u32 i) { return i | ((__popc(i) & 1) << 7); }
