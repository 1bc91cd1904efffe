// ---------------------------------------------------------------------------------------------
// Copy list of a journaled step's in-place undo (stage/undo.rs): job blockIdx.x copies n floats
// from src to dst (window ring rows, compressor frontier rows, whole frontiers), the grid's y blocks
// sharing it. One launch saves what a verify step will overwrite, one restores the rejected rows.
// ---------------------------------------------------------------------------------------------
struct CopyJob {
    const float* src;
    float* dst;
    u64 n;
};

extern "C" __global__ void copy_jobs(const CopyJob* jobs, int njobs) { PDL_ENTRY
    if ((int)blockIdx.x >= njobs) return;
    CopyJob j = jobs[blockIdx.x];
    u64 t = (u64)blockIdx.y * blockDim.x + threadIdx.x, stride = (u64)gridDim.y * blockDim.x;
    if ((j.n & 3) == 0 && (((u64)j.src | (u64)j.dst) & 15) == 0) {
        // Rows of 4k floats at 16-byte addresses (every job the stage makes): whole vectors.
        const float4* s = (const float4*)j.src;
        float4* d = (float4*)j.dst;
        for (u64 k = t; k < j.n / 4; k += stride) d[k] = s[k];
    } else {
        for (u64 k = t; k < j.n; k += stride) j.dst[k] = j.src[k];
    }
}
