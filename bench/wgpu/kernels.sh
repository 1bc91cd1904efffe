#!/usr/bin/env bash
# One device call for the wgpu kernels on Vulkan (results under $OUT, at most 8 files come back):
#  1. kernel_bench: each decode kernel and the prefill tiles (coop and f32) at the Flash shapes, this build with every product shape
#     (--sweep) -> kernels.csv, and the previous build's (device-bin/old-kb.xz) -> kernels_old.csv;
#  2. flash:6 decode / prefill, the previous ds4-bench (device-bin/old-bench.xz) and this one
#     -> ab_vulkan_flash6.csv;
#  3. the per-op profile of this one and the previous one (DS4_WGPU_PROFILE=1) -> profile_vulkan.log,
#     profile_vulkan_old.log;
#  4. with MTP=1, the MTP verify-step costs on flash:6 (bench/wgpu/mtp_costs.sh) -> mtp_costs_vulkan.txt;
#  5. with FLASH=flash:30, Vulkan (and Vulkan with --quality: f32 prefill tiles) and CUDA on that model
#     -> vulkan_vs_cuda.csv;
#  6. with WGPU_TESTS=1, the wgpu tests on the GPU -> wgpu_tests.log.
# Prepare: bench/cuda/build_device_bin.sh and the Vulkan loader in .gl (bench/wgpu/h200.sh says how).
# Run: tar -xJf device-bin/bins.tar.xz && bench/wgpu/kernels.sh
set -u
OUT=${OUT:-/tmp/out}; B=${B:-device-bin}
mkdir -p $OUT
export DS4_WEIGHTS=mmap
. bench/wgpu/vulkan_env.sh
T0=$(date +%s); el() { echo "[+$(( $(date +%s) - T0 ))s] $*"; }
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
cat README.md README.md README.md > /tmp/prompt.txt
# The model is written while the kernels are timed; waited for by its process id (a `pgrep -f` on its
# command line also matches a calling shell whose command line names it, and never ends).
SP=
[ -f /dev/shm/flash6.gguf ] || { timeout 200 $B/ds4-gguf synth flash:6 /dev/shm/flash6.gguf --mix q2 > /tmp/synth.log 2>&1 & SP=$!; }
el "kernel bench"
timeout 200 $B/kernel_bench ${ITERS:-200} --sweep > $OUT/kernels.csv 2>&1
if [ -f $B/old-kb.xz ]; then
  xz -dc $B/old-kb.xz > /tmp/old-kb && chmod +x /tmp/old-kb
  # Old, new (above), old again: the GPU's clocks settle over the first seconds.
  timeout 150 /tmp/old-kb ${ITERS:-200} > $OUT/kernels_old.csv 2>&1
  timeout 200 $B/kernel_bench ${ITERS:-200} > $OUT/kernels_new2.csv 2>&1
  timeout 150 /tmp/old-kb ${ITERS:-200} > $OUT/kernels_old2.csv 2>&1
  paste -d, $OUT/kernels_old.csv $OUT/kernels_new2.csv $OUT/kernels_old2.csv | cut -d, -f1,3,7,11
fi
[ -n "$SP" ] && wait $SP; tail -1 /tmp/synth.log 2>/dev/null
bench() { timeout ${TO:-150} $1 -m /dev/shm/flash6.gguf --prompt-file /tmp/prompt.txt --ctx-start 4096 --ctx-max 4096 --prefill-chunk 4096 --mem-limit-gb 200 --backend vulkan "${@:2}"; }
if [ -f $B/old-bench.xz ]; then
  xz -dc $B/old-bench.xz > /tmp/old-bench && chmod +x /tmp/old-bench
  el "flash:6 A/B: previous ds4-bench, this one (twice, interleaved)"
  for b in /tmp/old-bench $B/ds4-bench /tmp/old-bench $B/ds4-bench; do
    r=$(bench $b --gen-tokens 64 2>/dev/null | grep "^4096,")
    echo "$b,$r" | tee -a $OUT/ab_vulkan_flash6.csv
  done
fi
el "Vulkan profile (this ds4-bench, and the previous one if carried)"
DS4_WGPU_PROFILE=1 bench $B/ds4-bench --gen-tokens 32 > $OUT/profile_vulkan.log 2>&1
[ -x /tmp/old-bench ] && DS4_WGPU_PROFILE=1 bench /tmp/old-bench --gen-tokens 32 > $OUT/profile_vulkan_old.log 2>&1
grep -v "uploading" $OUT/profile_vulkan.log | grep -A26 "one-token steps" | head -30
if [ -n "${MTP:-}" ]; then
  el "MTP verify-step costs"
  OUT=$OUT B=$B bench/wgpu/mtp_costs.sh | tail -12
fi
if [ -n "${FLASH:-}" ]; then
  # Vulkan and CUDA on the bigger model, same call (flash:30 fits an 80 GB card).
  M=/dev/shm/${FLASH/:/}.gguf
  el "synth $FLASH"
  [ -f $M ] || timeout 300 $B/ds4-gguf synth $FLASH $M --mix q2 2>&1 | tail -1
  rm -f /dev/shm/flash6.gguf
  export LD_LIBRARY_PATH=/usr/local/cuda/lib64 DS4_CUDA_INCLUDE=/usr/local/cuda/include DS4_CUDA_CACHE=/tmp/ds4cache
  echo "backend,ctx_tokens,prefill_tokens,prefill_tps,gen_tokens,gen_tps,kvcache_bytes" > $OUT/vulkan_vs_cuda.csv
  # "vulkan --quality": the prefill products on f32 tiles (no cooperative matrices), same call.
  for be in vulkan "vulkan --quality" cuda; do
    el "$FLASH on $be"
    timeout 200 $B/ds4-bench -m $M --prompt-file /tmp/prompt.txt --ctx-start 4096 --ctx-max 4096 --prefill-chunk 4096 --mem-limit-gb 200 --backend $be --gen-tokens 64 2>/tmp/err.log | grep "^4096," | sed "s/^/${be// /},/" | tee -a $OUT/vulkan_vs_cuda.csv
  done
fi
if [ -n "${WGPU_TESTS:-}" ]; then
  el "wgpu tests on the GPU"
  . bench/wgpu/gpu_tests.sh
fi
el done
