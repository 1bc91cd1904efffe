#!/usr/bin/env bash
# One device call: the cost of a verify step of 1..5 tokens against a decode step on Vulkan (flash:6,
# ctx 4096; each step journaled and rolled back, median of 7) -> $OUT/mtp_costs_vulkan.txt.
# Prepare: bench/cuda/build_device_bin.sh (it copies examples/mtp_step_costs) and the loader in .gl.
# Run: tar -xJf device-bin/bins.tar.xz && bench/wgpu/mtp_costs.sh
set -u
OUT=${OUT:-/tmp/out}; B=${B:-device-bin}
mkdir -p $OUT
export DS4_WEIGHTS=mmap
. bench/wgpu/vulkan_env.sh
[ -f /dev/shm/flash6.gguf ] || timeout 200 $B/ds4-gguf synth flash:6 /dev/shm/flash6.gguf --mix q2 2>&1 | tail -1
timeout 300 $B/mtp_step_costs /dev/shm/flash6.gguf --backend vulkan --ctx-at ${AT:-4096} --reps 7 2>&1 | grep -v uploading | tee $OUT/mtp_costs_vulkan.txt
