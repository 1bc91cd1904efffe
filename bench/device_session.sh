#!/usr/bin/env bash
# One device call for this round's checks on the lent H200 (results under $OUT):
#  1. CUDA batched-session device tests (tiny q2/q4: deterministic = alone bit for bit, default close)
#     and the engine's batched CUDA tests;
#  2. the wgpu tests on the GPU through Vulkan;
#  3. full Flash q2: ds4-bench --backend vulkan and --backend cuda (bench/wgpu/h200.sh, one round),
#     then a flash:6 Vulkan A/B of the previous ds4-bench (device-bin/old/ds4-bench, if carried) against
#     this one, and this one's per-op profile (DS4_WGPU_PROFILE=1);
#  4. CUDA batched sessions: ds4-bench --concurrency 1/2/4/8 (and 8 with --deterministic) -> batching.csv;
#  5. cold start of ds4-server on CUDA (empty kernel cache, then warm).
# Prepare: bench/cuda/build_device_bin.sh; the Vulkan loader in .gl (bench/wgpu/h200.sh says how).
# Run: tar -xJf device-bin/bins.tar.xz && bench/device_session.sh   (carry device-bin/bins.tar.xz, .gl)
set -u
OUT=${OUT:-/tmp/out}; B=${B:-device-bin}
mkdir -p $OUT
export DS4_WEIGHTS=mmap LD_LIBRARY_PATH=/usr/local/cuda/lib64 DS4_CUDA_INCLUDE=/usr/local/cuda/include DS4_CUDA_CACHE=/tmp/ds4cache
. bench/wgpu/vulkan_env.sh
T0=$(date +%s); el() { echo "[+$(( $(date +%s) - T0 ))s] $*"; }
if [ -z "${SKIP_TESTS:-}" ]; then
  el "CUDA batch device tests"
  DS4_TEST_DIR=/dev/shm timeout 200 $B/device-tests --nocapture --test-threads 1 batch 2>&1 | tee $OUT/cuda_batch_tests.log | grep -E "^test |test result|agreement|worst|panicked" | head -30
  timeout 150 $B/engine-batch-tests --nocapture --test-threads 1 2>&1 | tee $OUT/engine_batch_tests.log | grep -E "^test |test result|agreement|worst|panicked" | head -20
fi
el "Vulkan vs CUDA (full Flash q2, or FLASH=flash:N layers on a smaller GPU) and the wgpu GPU tests"
FLASH=${FLASH:-flash}; M=/dev/shm/${FLASH/:/}.gguf
[ -f $M ] || timeout 300 $B/ds4-gguf synth $FLASH $M --mix q2 2>&1 | tail -1
M=$M PROFILE= ROUNDS=1 WT=${WT:-100} B=$B OUT=$OUT bench/wgpu/h200.sh 2>&1 | grep -v "^test .* ok$" | tail -30
el "flash:6 Vulkan A/B and profile"
[ -f /dev/shm/flash6.gguf ] || timeout 120 $B/ds4-gguf synth flash:6 /dev/shm/flash6.gguf --mix q2 2>&1 | tail -1
for b in $B/old/ds4-bench $B/ds4-bench $B/old/ds4-bench $B/ds4-bench; do
  [ -x $b ] || continue
  r=$(XDG_RUNTIME_DIR=/tmp timeout 120 $b -m /dev/shm/flash6.gguf --prompt-file /tmp/prompt.txt --backend vulkan --ctx-start 4096 --ctx-max 4096 \
      --gen-tokens 64 --prefill-chunk 4096 --mem-limit-gb 200 2>/dev/null | grep "^4096,")
  echo "ab $b: $r" | tee -a $OUT/ab_flash6_vulkan.log
done
XDG_RUNTIME_DIR=/tmp DS4_WGPU_PROFILE=1 timeout 150 $B/ds4-bench -m /dev/shm/flash6.gguf --prompt-file /tmp/prompt.txt --backend vulkan --ctx-start 4096 --ctx-max 4096 \
  --gen-tokens 32 --prefill-chunk 4096 --mem-limit-gb 200 > $OUT/profile_vulkan.log 2>&1
grep -v "uploading" $OUT/profile_vulkan.log | grep -A14 "wgpu profile" | head -60
el "CUDA batched sessions: aggregate decode at 1, 2, 4, 8 streams (and 8 deterministic)"
echo "mode,streams,csv" > $OUT/batching.csv
for c in 1 2 4 8 8d; do
  n=${c%d}; det=; mode=default; [ "$c" != "$n" ] && { det=--deterministic; mode=deterministic; }
  r=$(timeout 150 $B/ds4-bench -m $M --prompt-file /tmp/prompt.txt --backend cuda --ctx-start 4096 --ctx-max 4096 --gen-tokens 64 \
      --prefill-chunk 4096 --mem-limit-gb 200 --concurrency $n $det 2>$OUT/batch_$c.err | grep "^4096,")
  echo "$mode,$n,$r" | tee -a $OUT/batching.csv
done
if [ -z "${SKIP_COLD:-}" ]; then
  el "cold start"
  M=$M REPS=1 OUT=$OUT bench/cuda/cold_start.sh 2>&1 | tail -12
fi
el done
