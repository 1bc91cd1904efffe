#!/usr/bin/env bash
# One device call: kernel compile, GPU-vs-CPU tests, full Flash q2 synthetic benchmark.
# Usage on the lent H200 (from the repo root, binaries carried in device-bin/): bench/cuda/device_run.sh [tests|bench|all]
set -u
export DS4_WEIGHTS=mmap LD_LIBRARY_PATH=/usr/local/cuda/lib64 DS4_CUDA_INCLUDE=/usr/local/cuda/include DS4_CUDA_CACHE=/tmp/ds4cache
B=${B:-device-bin}
OUT=${OUT:-/tmp/out}
mode=${1:-all}
T0=$(date +%s)
el() { echo "[+$(( $(date +%s) - T0 ))s] $*"; }
nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total,clocks.sm,clocks.mem --format=csv
if [ "$mode" != tests ]; then
  el "synth flash q2"
  [ -f /dev/shm/flash.gguf ] || timeout 240 $B/ds4-gguf synth flash /dev/shm/flash.gguf --mix q2 2>&1 | tail -1
  ls -la /dev/shm; free -g | head -2
  cat README.md README.md README.md > /tmp/prompt.txt
  el "bench"
  timeout ${BENCH_T:-300} $B/ds4-bench -m /dev/shm/flash.gguf --prompt-file /tmp/prompt.txt --ctx-start 512 --ctx-max 32768 --step-mul 8 \
    --gen-tokens 32 --prefill-chunk 4096 --backend cuda --mem-limit-gb 200 --csv $OUT/cuda_flash_q2.csv 2>&1 | tee $OUT/bench.log | grep -v "uploading weights"
  echo "bench rc=${PIPESTATUS[0]}"; dmesg 2>/dev/null | tail -3
  cat $OUT/cuda_flash_q2.csv
  el "profile run (ctx 4096, CUDA events per kernel)"
  DS4_CUDA_PROFILE=1 timeout ${PROF_T:-120} $B/ds4-bench -m /dev/shm/flash.gguf --prompt-file /tmp/prompt.txt --ctx-start 4096 --ctx-max 4096 \
    --gen-tokens 16 --prefill-chunk 4096 --backend cuda --mem-limit-gb 200 --csv $OUT/profile.csv 2>&1 | tee $OUT/profile.log | grep -v "uploading weights"
fi
if [ "$mode" != bench ]; then
  el "device tests (tiny)"
  DS4_TEST_DIR=/dev/shm timeout 120 $B/device-tests --nocapture --test-threads 1 2>&1 | tee $OUT/tests.log | grep -v "^$"
fi
if [ "$mode" = all ] || [ "$mode" = flash ]; then
  el "flash:4 model test"
  DS4_TEST_DIR=/dev/shm timeout ${FT:-150} $B/device-tests --nocapture --test-threads 1 --ignored flash4 2>&1 | tee $OUT/tests_flash.log | grep -v "^$"
fi
el done
