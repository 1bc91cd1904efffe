#!/usr/bin/env bash
# Where a decode kernel's warps wait, instruction by instruction (Nsight Compute's source counters:
# stall samples per SASS line), as it runs in the CUDA graph of flash:L q2 at ctx CTX.
# Usage on the device: KERNEL=hc_entry_dec [B=device-bin] bench/cuda/ncu_source.sh [layers]
# (writes $OUT/ncu_source_$KERNEL.csv.gz, the source page, and ncu_source_$KERNEL.txt, the warp-state
# section; bench/cuda/ncu_source_top.py summarises the CSV here.)
set -u
export DS4_WEIGHTS=mmap LD_LIBRARY_PATH=/usr/local/cuda/lib64 DS4_CUDA_INCLUDE=/usr/local/cuda/include DS4_CUDA_CACHE=/tmp/ds4cache
B=${B:-device-bin}; OUT=${OUT:-/tmp/out}; L=${1:-12}; CTX=${CTX:-4096}; K=${KERNEL:-hc_entry_dec}; mkdir -p $OUT
[ -f /dev/shm/flash$L.gguf ] || $B/ds4-gguf synth flash:$L /dev/shm/flash$L.gguf --mix q2 2>&1 | tail -1
cat README.md README.md README.md > /tmp/prompt.txt
NCU=/usr/local/cuda/bin/ncu
timeout ${NCU_TIMEOUT:-300} $NCU --graph-profiling node --cache-control none --clock-control none -f -o /tmp/ncu_src_$K \
  --kernel-name $K --launch-skip ${SKIP:-60} --launch-count ${COUNT:-4} \
  --section SourceCounters --section WarpStateStats --section LaunchStats \
  $B/ds4-bench -m /dev/shm/flash$L.gguf --prompt-file /tmp/prompt.txt --ctx-start $CTX --ctx-max $CTX --gen-tokens 16 \
  --prefill-chunk 4096 --backend cuda --mem-limit-gb 200 > $OUT/ncu_source_$K.log 2>&1
echo "ncu rc=$?"
$NCU --import /tmp/ncu_src_$K.ncu-rep --page details > $OUT/ncu_source_$K.txt 2>&1
$NCU --import /tmp/ncu_src_$K.ncu-rep --page source --print-source sass --csv 2>&1 | gzip > $OUT/ncu_source_$K.csv.gz
grep -E "Duration|Warp Cycles Per Issued|Stall|Registers" $OUT/ncu_source_$K.txt | head -20
