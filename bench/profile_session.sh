#!/usr/bin/env bash
# One device call that measures where time goes and the headline numbers (results under $OUT, at most
# 8 files come back):
#  1. CUDA per-kernel profile (DS4_CUDA_PROFILE=1) of a flash:6 decode alone and with 8 batched
#     streams -> cuda_prof.log;
#  2. the wgpu per-op profile on Vulkan, flash:6 -> profile_vulkan.log;
#  3. CUDA batched sessions on $FLASH (flash:30 fits an 80 GB card): --concurrency 1/2/4/8/8d -> batching.csv;
#  4. Vulkan and CUDA on $FLASH, same call -> vulkan_vs_cuda.csv, bench.log;
#  5. the wgpu tests on the GPU (WGPU_TESTS=1) -> wgpu_tests.log.
# Prepare: bench/cuda/build_device_bin.sh and the Vulkan loader in .gl (bench/wgpu/h200.sh says how).
# Run: tar -xJf device-bin/bins.tar.xz && FLASH=flash:30 bench/profile_session.sh
set -u
OUT=${OUT:-/tmp/out}; B=${B:-device-bin}; FLASH=${FLASH:-flash:30}
mkdir -p $OUT
export DS4_WEIGHTS=mmap LD_LIBRARY_PATH=/usr/local/cuda/lib64 DS4_CUDA_INCLUDE=/usr/local/cuda/include DS4_CUDA_CACHE=/tmp/ds4cache
. bench/wgpu/vulkan_env.sh
T0=$(date +%s); el() { echo "[+$(( $(date +%s) - T0 ))s] $*"; }
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
cat README.md README.md README.md > /tmp/prompt.txt
M=/dev/shm/${FLASH/:/}.gguf
[ -f $M ] || (timeout 300 $B/ds4-gguf synth $FLASH $M --mix q2 > /tmp/synth.log 2>&1 &)
[ -f /dev/shm/flash6.gguf ] || timeout 120 $B/ds4-gguf synth flash:6 /dev/shm/flash6.gguf --mix q2 2>&1 | tail -1
bench() { timeout ${TO:-150} $B/ds4-bench -m $1 --prompt-file /tmp/prompt.txt --ctx-start 4096 --ctx-max 4096 --prefill-chunk 4096 --mem-limit-gb 200 "${@:2}"; }
if [ -z "${SKIP_PROFILE:-}" ]; then
  for c in 1 8; do
    el "CUDA profile, $c stream(s)"
    echo "== concurrency $c" >> $OUT/cuda_prof.log
    DS4_CUDA_PROFILE=1 bench /dev/shm/flash6.gguf --backend cuda --gen-tokens 16 --concurrency $c >> $OUT/cuda_prof.log 2>&1
  done
  if [ -f $B/old-bench.xz ]; then
    xz -dc $B/old-bench.xz > /tmp/old-bench && chmod +x /tmp/old-bench
    el "Vulkan flash:6 A/B: previous ds4-bench, this one"
    for b in /tmp/old-bench $B/ds4-bench; do
      r=$(timeout 150 $b -m /dev/shm/flash6.gguf --prompt-file /tmp/prompt.txt --ctx-start 4096 --ctx-max 4096 --prefill-chunk 4096 --mem-limit-gb 200 --backend vulkan --gen-tokens 64 2>/dev/null | grep "^4096,")
      echo "$b,$r" | tee -a $OUT/ab_vulkan_flash6.csv
    done
  fi
  el "Vulkan profile"
  DS4_WGPU_PROFILE=1 bench /dev/shm/flash6.gguf --backend vulkan --gen-tokens 32 > $OUT/profile_vulkan.log 2>&1
  grep -v "uploading" $OUT/profile_vulkan.log | grep -A24 "wgpu profile" | head -40
fi
while pgrep -f "ds4-gguf synth" >/dev/null; do sleep 2; done; tail -1 /tmp/synth.log 2>/dev/null
el "CUDA batched sessions on $FLASH"
echo "mode,ctx_tokens,prefill_tokens,prefill_tps,gen_tokens,gen_tps,kvcache_bytes,streams,aggregate_gen_tps,per_stream_gen_tps" > $OUT/batching.csv
for c in ${STREAMS:-1 2 4 8 8d}; do
  n=${c%d}; det=; mode=default; [ "$c" != "$n" ] && { det=--deterministic; mode=deterministic; }
  r=$(bench $M --backend cuda --gen-tokens 64 --concurrency $n $det 2>/tmp/batch.err | grep "^4096,")
  echo "$mode,$r" | tee -a $OUT/batching.csv
done
el "Vulkan vs CUDA on $FLASH"
echo "backend,csv" > $OUT/vulkan_vs_cuda.csv
for be in vulkan cuda; do
  TO=200 bench $M --backend $be --gen-tokens 64 --csv /tmp/run.csv > /tmp/run.log 2>&1
  echo "== $be (exit $?)" >> $OUT/bench.log; grep -v "uploading" /tmp/run.log | tail -20 >> $OUT/bench.log
  tail -n +2 /tmp/run.csv 2>/dev/null | sed "s/^/$be,/" | tee -a $OUT/vulkan_vs_cuda.csv
  rm -f /tmp/run.csv
done
if [ -n "${WGPU_TESTS:-}" ]; then
  el "wgpu tests on the GPU"
  . bench/wgpu/gpu_tests.sh
fi
el done
