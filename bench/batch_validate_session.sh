#!/usr/bin/env bash
# One device call: the ds4-cuda device tests and the engine's CUDA batch tests of this tree, then CUDA
# batched decode on flash:12 at 1, 2, 4, 8 streams (default, and 8 --deterministic) -> $OUT/results.tgz.
# Binaries (here): device-bin/bins.tar.xz with ds4-bench, ds4-gguf, device-tests (ds4-cuda --test device)
# and engine-batch-tests (ds4-engine --features "cuda wgpu" --test decode_batch_cuda).
. bench/device_prelude.sh
M=/dev/shm/flash12.gguf
(timeout 300 $B/ds4-gguf synth flash:12 $M --mix q2 > $OUT/synth.log 2>&1) & SP=$!
DS4_TEST_DIR=/dev/shm timeout 200 $B/device-tests --nocapture --test-threads 1 > $OUT/device_tests.log 2>&1
grep -E "^test .*FAILED|test result|panicked" $OUT/device_tests.log; el "device tests done"; pack
timeout 150 $B/engine-batch-tests --nocapture --test-threads 1 > $OUT/engine_batch_tests.log 2>&1
grep -E "^test |test result|panicked|engine default" $OUT/engine_batch_tests.log; el "engine batch tests done"; pack
wait $SP
cat README.md README.md README.md > /tmp/prompt.txt
batch_rates $M 48 "1 2 4 8 8d"
el done; pack
