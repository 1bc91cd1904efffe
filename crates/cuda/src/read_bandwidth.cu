// Streaming read of `n16` 16-byte words (grid-stride), for the machine's achievable read bandwidth.
extern "C" __global__ void read_sum(const uint4* __restrict__ src, u64 n16, u32* out) { PDL_ENTRY
    u32 acc = 0;
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n16; i += (u64)gridDim.x * blockDim.x) {
        uint4 v = __ldcs(src + i);
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    if (acc == 0x9e3779b9u) out[0] = acc;  // keeps the loads live
}
