#!/usr/bin/env bash
# One device call for CUDA batched sessions (results under $OUT): the CUDA device tests (the whole
# suite, or those matching $FILTER), the engine's batched tests, then ds4-bench --concurrency 1, 2, 4, 8
# (and 8 with --deterministic) on a synthetic Flash q2 (FLASH=flash for the full model on an H200,
# flash:30 on an 80 GB card) at ctx 4096 -> batching.csv.
# Prepare: bench/cuda/build_device_bin.sh. Run: tar -xJf device-bin/bins.tar.xz && bench/cuda/batch_session.sh
set -u
OUT=${OUT:-/tmp/out}; B=${B:-device-bin}; FLASH=${FLASH:-flash}
mkdir -p $OUT
export DS4_WEIGHTS=mmap LD_LIBRARY_PATH=/usr/local/cuda/lib64 DS4_CUDA_INCLUDE=/usr/local/cuda/include DS4_CUDA_CACHE=/tmp/ds4cache
T0=$(date +%s); el() { echo "[+$(( $(date +%s) - T0 ))s] $*"; }
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
el "CUDA device tests ${FILTER:-}"
DS4_TEST_DIR=/dev/shm timeout ${TT:-300} $B/device-tests --nocapture --test-threads 1 ${FILTER:-} > $OUT/device_tests.log 2>&1
grep -E "^test .*(ok|FAILED)$|test result|rows pick|bit-identical|panicked" $OUT/device_tests.log | grep -v " ok$" | head -30
grep -E "test result" $OUT/device_tests.log
timeout 150 $B/engine-batch-tests --nocapture --test-threads 1 > $OUT/engine_batch_tests.log 2>&1
grep -E "test result|rows pick|panicked" $OUT/engine_batch_tests.log
M=/dev/shm/${FLASH/:/}.gguf
[ -f $M ] || timeout 300 $B/ds4-gguf synth $FLASH $M --mix q2 2>&1 | tail -1
cat README.md README.md README.md > /tmp/prompt.txt
el "batched sessions on $FLASH"
echo "mode,ctx_tokens,prefill_tokens,prefill_tps,gen_tokens,gen_tps,kvcache_bytes,streams,aggregate_gen_tps,per_stream_gen_tps" > $OUT/batching.csv
for c in 1 2 4 8 8d; do
  n=${c%d}; det=; mode=default; [ "$c" != "$n" ] && { det=--deterministic; mode=deterministic; }
  r=$(timeout 150 $B/ds4-bench -m $M --prompt-file /tmp/prompt.txt --backend cuda --ctx-start 4096 --ctx-max 4096 --gen-tokens 64 \
      --prefill-chunk 4096 --mem-limit-gb 200 --concurrency $n $det 2>$OUT/batch_$c.err | grep "^4096,")
  echo "$mode,$r" | tee -a $OUT/batching.csv
done
rm -f $OUT/batch_*.err
el done
