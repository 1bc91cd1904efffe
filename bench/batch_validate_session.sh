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
echo "mode,ctx_tokens,prefill_tokens,prefill_tps,gen_tokens,gen_tps,kvcache_bytes,streams,aggregate_gen_tps,per_stream_gen_tps" > $OUT/batching.csv
for c in 1 2 4 8 8d; do
  n=${c%d}; det=; mode=default; [ "$c" != "$n" ] && { det=--deterministic; mode=deterministic; }
  x=$(timeout 100 $B/ds4-bench -m $M --prompt-file /tmp/prompt.txt --backend cuda --ctx-start 4096 --ctx-max 4096 --gen-tokens 48 \
      --prefill-chunk 4096 --mem-limit-gb 200 --concurrency $n $det 2>$OUT/batch_$c.err | grep "^4096,")
  echo "$mode,$x" | tee -a $OUT/batching.csv
done
el done; pack
