#!/usr/bin/env bash
# One device call (2026-12-07): the wgpu steering tests of this tree on the GPU (device-bin/wgpu-stage-main,
# carried beside device-bin/bins.tar.xz; .gl for the Vulkan loader), then CUDA batched decode on
# flash:12 at 1..8 streams, default (multi-token kernels) against --deterministic (exact rows: each row
# through the decode kernels), two interleaved rounds -> $OUT/results.tgz (batching.csv).
. bench/device_prelude.sh
M=/dev/shm/flash12.gguf
(timeout 300 $B/ds4-gguf synth flash:12 $M --mix q2 > $OUT/synth.log 2>&1) & SP=$!
. bench/wgpu/vulkan_env.sh
timeout 200 device-bin/wgpu-stage-main steering --include-ignored --test-threads 1 --nocapture > $OUT/steering.log 2>&1
grep -E "rel err|test result" $OUT/steering.log; el "steering done"; pack
wait $SP
cat README.md README.md README.md > /tmp/prompt.txt
for r in 1 2; do batch_rates $M 48 "1 2 2d 3 3d 4 4d 6 6d 8 8d" _$r; pack; done
el done; pack
