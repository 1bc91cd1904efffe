#!/usr/bin/env bash
# One device call for prefill work on CUDA (results under $OUT): the ds4-cuda device tests (and with
# FLASH4=1 the Flash-shaped ones, flash:4 against the CPU, --ignored) while $FLASH (flash:30 on an 80 GB card,
# flash on an H200) is synthesized, then bench/cuda/prefill_profile.sh (A/B with old-bench.xz).
# Run: tar -xJf device-bin/bins.tar.xz && bench/cuda/prefill_session.sh
set -u
OUT=${OUT:-/tmp/out}; B=${B:-device-bin}
mkdir -p $OUT
export DS4_WEIGHTS=mmap LD_LIBRARY_PATH=/usr/local/cuda/lib64 DS4_CUDA_INCLUDE=/usr/local/cuda/include DS4_CUDA_CACHE=/tmp/ds4cache
FLASH=${FLASH:-$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1 | awk '{print ($1>100000)?"flash":"flash:30"}')}
M=/dev/shm/${FLASH/:/}.gguf
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
T0=$(date +%s); el() { echo "[+$(( $(date +%s) - T0 ))s] $*"; }
SP=
[ -f $M ] || { timeout 400 $B/ds4-gguf synth $FLASH $M --mix q2 > /tmp/synth.log 2>&1 & SP=$!; }
if [ -z "${NO_TESTS:-}" ]; then
  el "device tests"
  DS4_TEST_DIR=/dev/shm timeout 300 $B/device-tests --nocapture --test-threads 1 > $OUT/device_tests.log 2>&1
  grep -E "^test .*FAILED|test result|panicked" $OUT/device_tests.log
  grep -E "^op grouped" $OUT/device_tests.log
  if [ -n "${FLASH4:-}" ]; then
    el "flash:4 tests (--ignored)"
    DS4_TEST_DIR=/dev/shm timeout 400 $B/device-tests --nocapture --test-threads 1 --ignored flash4 > $OUT/flash4_tests.log 2>&1
    grep -E "^test |^model|worst|panicked|test result" $OUT/flash4_tests.log | head -30
    rm -f /dev/shm/ds4cuda-flash_4*
  fi
fi
[ -n "$SP" ] && wait $SP; tail -1 /tmp/synth.log
el "prefill by chunk"
M=$M OUT=$OUT/prefill bash bench/cuda/prefill_profile.sh
if [ -n "${ROUTE:-}" ]; then
  # Issue 29's route against the single process on the same file (2 stages, 32-bit and 16-bit prefill).
  el "2-stage route vs single"
  L=${FLASH#flash:}; [ "$L" = flash ] && L=43
  B=$B M=$M SPLIT=$(( L / 2 - 1 + L % 2 )) BACKEND=cuda PCHUNK_RUNS=0 GEN=${GEN:-128} OUT=$OUT/route CSV=$OUT/route_gpu.csv \
    bash bench/dist/route_vs_single.sh 32 p16 2>&1 | tail -12
fi
el done
(cd $OUT && tar -czf /tmp/prefill_results.tgz . && rm -rf ./* && mv /tmp/prefill_results.tgz results.tgz)
