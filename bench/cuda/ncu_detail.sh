#!/usr/bin/env bash
# Nsight Compute detail (launch configuration, registers, occupancy, warp stall reasons, throughput) of
# chosen decode kernels as they run in the CUDA graph of flash:L q2 at ctx CTX.
# Usage on the device: KERNELS='regex:^(hc_pre_dec|attn_dec)$' bench/cuda/ncu_detail.sh [layers]
set -u
export DS4_WEIGHTS=mmap LD_LIBRARY_PATH=/usr/local/cuda/lib64 DS4_CUDA_INCLUDE=/usr/local/cuda/include DS4_CUDA_CACHE=/tmp/ds4cache
B=${B:-device-bin}; OUT=${OUT:-/tmp/out}; L=${1:-6}; CTX=${CTX:-4096}; mkdir -p $OUT
[ -f /dev/shm/flash$L.gguf ] || $B/ds4-gguf synth flash:$L /dev/shm/flash$L.gguf --mix q2 2>&1 | tail -1
cat README.md README.md README.md > /tmp/prompt.txt
timeout 500 /usr/local/cuda/bin/ncu --graph-profiling node --cache-control none --clock-control none \
  --kernel-name "${KERNELS:-regex:^(hc_pre_dec|attn_dec|idx_scores|mvq8_q8s_n1|mvq8_iq2s_n1)$}" --launch-skip ${SKIP:-40} --launch-count ${COUNT:-12} \
  --section LaunchStats --section Occupancy --section WarpStateStats --section SpeedOfLight --section MemoryWorkloadAnalysis \
  $B/ds4-bench -m /dev/shm/flash$L.gguf --prompt-file /tmp/prompt.txt --ctx-start $CTX --ctx-max $CTX --gen-tokens 16 \
  --prefill-chunk 4096 --backend cuda --mem-limit-gb 200 > $OUT/ncu_detail.txt 2> $OUT/ncu_detail.err
echo "ncu rc=$?"
grep -E "^  [a-z_0-9]+\(|Duration|Registers Per|Achieved Occupancy|Theoretical Occupancy|Memory Throughput|DRAM Throughput|Stall|Warp Cycles Per Issued|Block Limit|Waves Per SM|Dynamic Shared|Static Shared" $OUT/ncu_detail.txt | head -${LINES_MAX:-400}
