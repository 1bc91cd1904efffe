#!/usr/bin/env bash
# The wgpu backend through Vulkan on the lent H200, beside the CUDA backend in the same call:
#  1. the ds4-wgpu tests on the real GPU (ops against the CPU, the whole tiny-model stage);
#  2. full Flash q2 (synthetic, 43 layers): ds4-bench --backend vulkan and --backend cuda interleaved
#     (V, C, V, C) at ctx 4096 with a 4096-token prefill chunk and 64 generated tokens.
# Prepare here (x86-64, the repo root):
#   bench/cuda/build_device_bin.sh            # binaries with --features "cuda wgpu" into device-bin/
#   echo /.gl/ >> .git/info/exclude; mkdir -p .gl /tmp/amd64/partial
#   o='-oAPT::Architecture=amd64 -oAPT::Architectures=amd64 -oDir::State::Lists=/tmp/amd64'
#   apt-get $o update; (cd .gl && apt-get $o download libvulkan1 libglvnd0 libegl1 libgl1 libglx0 libopengl0 libgles2)
# Run on the device (carry device-bin/ds4-bench, device-bin/ds4-gguf, device-bin/wgpu-*-tests, .gl):
#   bench/wgpu/h200.sh        (results in $OUT: wgpu_tests.log, vulkan_vs_cuda.csv, bench.log)
set -u
OUT=${OUT:-/tmp/out}
B=${B:-device-bin}
M=${M:-/dev/shm/flash.gguf}
mkdir -p $OUT
# The Vulkan loader is not on the device: unpack the carried one, and name NVIDIA's ICD if needed.
. bench/wgpu/vulkan_env.sh
export XDG_RUNTIME_DIR=/tmp DS4_WEIGHTS=mmap LD_LIBRARY_PATH=/usr/local/cuda/lib64 DS4_CUDA_INCLUDE=/usr/local/cuda/include DS4_CUDA_CACHE=/tmp/ds4cache
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
for t in $B/wgpu-*-tests; do
  [ -x $t ] && timeout ${WT:-240} $t --test-threads 1 2>&1 | tee -a $OUT/wgpu_tests.log | grep -E "^test |test result|on .*\(Vulkan\)"
done
cat README.md README.md README.md > /tmp/prompt.txt
[ -f $M ] || timeout 300 $B/ds4-gguf synth flash $M --mix q2 2>&1 | tail -1
echo "backend,round,csv" > $OUT/vulkan_vs_cuda.csv
for round in ${ROUNDS:-1 2}; do
  for be in vulkan cuda; do
    timeout 280 $B/ds4-bench -m $M --prompt-file /tmp/prompt.txt --backend $be --ctx-start 4096 --ctx-max 4096 \
      --gen-tokens 64 --prefill-chunk 4096 --mem-limit-gb 200 --csv /tmp/run.csv > /tmp/run.log 2>&1
    echo "== $be round $round (exit $?)" >> $OUT/bench.log; cat /tmp/run.log >> $OUT/bench.log
    tail -n +2 /tmp/run.csv 2>/dev/null | sed "s/^/$be,$round,/" >> $OUT/vulkan_vs_cuda.csv
  done
done
head -1 /tmp/run.csv 2>/dev/null
# Per-op GPU time and host time per step (DS4_WGPU_PROFILE=1) on a 6-layer Flash (same per-layer shapes).
if [ -n "${PROFILE:-}" ]; then
  [ -f /dev/shm/flash6.gguf ] || timeout 120 $B/ds4-gguf synth flash:6 /dev/shm/flash6.gguf --mix q2 2>&1 | tail -1
  DS4_WGPU_PROFILE=1 timeout 200 $B/ds4-bench -m /dev/shm/flash6.gguf --prompt-file /tmp/prompt.txt --backend vulkan --ctx-start 4096 --ctx-max 4096 \
    --gen-tokens 32 --prefill-chunk 4096 --mem-limit-gb 200 > $OUT/profile_vulkan.log 2>&1
  grep -v "uploading" $OUT/profile_vulkan.log | tail -80
fi
cat $OUT/vulkan_vs_cuda.csv
