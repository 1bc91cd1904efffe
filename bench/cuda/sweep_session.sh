#!/usr/bin/env bash
# Issue 22's sweep in one device call (results under $OUT, packed into results.tgz): the full Flash q2
# file on an H200 ($FLASH, default flash; flash:30 fits an 80 GB card), the previous build's ds4-bench
# (device-bin/old-bench.xz) and this build's, each over ctx 512 -> 32768 (--step-mul 8, 64 generated
# tokens, --prefill-chunk 4096) -> cuda_flash_q2_old.csv / cuda_flash_q2.csv; with ROUTE=1 issue 29's
# 2-stage route against the single process (32-bit and 16-bit prefill; ROUTE_CHUNK, default 4096, is
# both sides' prefill chunk: 2048 lets flash:30's two stages share an 80 GB card) -> route/; then prefill by
# chunk size (bench/cuda/prefill_profile.sh, both builds) -> chunks/.
# Run: tar -xJf device-bin/bins.tar.xz && bench/cuda/sweep_session.sh
set -u
OUT=${OUT:-/tmp/out}; B=${B:-device-bin}; FLASH=${FLASH:-flash}
mkdir -p $OUT
export DS4_WEIGHTS=mmap LD_LIBRARY_PATH=/usr/local/cuda/lib64 DS4_CUDA_INCLUDE=/usr/local/cuda/include DS4_CUDA_CACHE=/tmp/ds4cache
M=/dev/shm/${FLASH/:/}.gguf
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $OUT/gpu.txt
T0=$(date +%s); el() { echo "[+$(( $(date +%s) - T0 ))s] $*"; }
el "synth $FLASH q2"
[ -f $M ] || timeout 300 $B/ds4-gguf synth $FLASH $M --mix q2 2>&1 | tail -1
cat README.md README.md README.md > /tmp/prompt.txt
xz -dc $B/old-bench.xz > /tmp/old-bench && chmod +x /tmp/old-bench
sweep() { # binary, csv
  el "sweep $(basename $1)"
  timeout 200 $1 -m $M --prompt-file /tmp/prompt.txt --ctx-start 512 --ctx-max 32768 --step-mul 8 --gen-tokens 64 \
    --prefill-chunk 4096 --backend cuda --mem-limit-gb 200 --csv $2 > ${2%.csv}.log 2>&1
  cat $2
}
sweep /tmp/old-bench $OUT/cuda_flash_q2_old.csv
sweep $B/ds4-bench $OUT/cuda_flash_q2.csv
if [ -n "${ROUTE:-}" ]; then
  el "2-stage route vs single"
  L=${FLASH#flash:}; [ "$L" = flash ] && L=43
  B=$B M=$M SPLIT=$(( L / 2 - 1 + L % 2 )) BACKEND=cuda PCHUNK_RUNS=0 GEN=64 RT=150 CHUNK=${ROUTE_CHUNK:-4096} OUT=$OUT/route CSV=$OUT/route_gpu.csv \
    bash bench/dist/route_vs_single.sh 32 p16 2>&1 | tail -8
fi
el "prefill by chunk"
M=$M OUT=$OUT/chunks bash bench/cuda/prefill_profile.sh
el done
