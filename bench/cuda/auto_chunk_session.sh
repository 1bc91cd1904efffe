#!/usr/bin/env bash
# One device call for the prefill chunk chosen without --prefill-chunk (results under $OUT): the
# ds4-cuda device tests while $FLASH (flash:30 on an 80 GB card, flash on an H200) is synthesized, then
# ds4-bench's sweep (ctx 512 -> 32768) without --prefill-chunk and with --prefill-chunk 4096 / 256.
# Run: bench/cuda/auto_chunk_session.sh (it unpacks device-bin/bins.tar.xz)
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
tar -xJf device-bin/bins.tar.xz
export DS4_WEIGHTS=mmap LD_LIBRARY_PATH=/usr/local/cuda/lib64 DS4_CUDA_INCLUDE=/usr/local/cuda/include DS4_CUDA_CACHE=/tmp/ds4cache
F=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1 | awk '{print ($1>100000)?"flash":"flash:30"}')
M=/dev/shm/${F/:/}.gguf
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $OUT/gpu.txt
(timeout 300 device-bin/ds4-gguf synth $F $M --mix q2 > /tmp/synth.log 2>&1) & SP=$!
DS4_TEST_DIR=/dev/shm timeout 200 device-bin/device-tests --nocapture --test-threads 1 > $OUT/device_tests.log 2>&1
grep -E "^test .*FAILED|test result|panicked" $OUT/device_tests.log
wait $SP; tail -1 /tmp/synth.log
cat README.md README.md README.md > /tmp/prompt.txt
for c in auto 4096 256; do
  flag=; [ $c != auto ] && flag="--prefill-chunk $c"
  timeout 200 device-bin/ds4-bench -m $M --prompt-file /tmp/prompt.txt --ctx-start 512 --ctx-max 32768 --step-mul 8 --gen-tokens 64 \
    --backend cuda --mem-limit-gb 200 $flag --csv $OUT/sweep_$c.csv > $OUT/sweep_$c.log 2>&1
  echo "== $c"; grep -h "prefill chunk\|GPU plan" $OUT/sweep_$c.log; cat $OUT/sweep_$c.csv
done
(cd $OUT && tar -czf /tmp/v.tgz . && rm -rf ./* && mv /tmp/v.tgz results.tgz)
