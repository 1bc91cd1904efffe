#!/usr/bin/env bash
# One device call (results packed into $OUT/results.tgz): the ds4-cuda device tests while Flash q2 is
# synthesized (flash on an H200, flash:30 on an 80 GB card), then bench/cuda/sweep_session.sh: issue 22's sweep
# with the previous builds beside (old-bench.xz) and issue 29's 2-stage route (ROUTE_CHUNK=$RC, default 4096).
# Run: bench/cuda/validate_session.sh (it unpacks device-bin/bins.tar.xz)
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
tar -xJf device-bin/bins.tar.xz
export DS4_WEIGHTS=mmap LD_LIBRARY_PATH=/usr/local/cuda/lib64 DS4_CUDA_INCLUDE=/usr/local/cuda/include DS4_CUDA_CACHE=/tmp/ds4cache
F=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1 | awk '{print ($1>100000)?"flash":"flash:30"}')
M=/dev/shm/${F/:/}.gguf
(timeout 300 device-bin/ds4-gguf synth $F $M --mix q2 > /tmp/synth.log 2>&1) & SP=$!
DS4_TEST_DIR=/dev/shm timeout 200 device-bin/device-tests --nocapture --test-threads 1 > $OUT/device_tests.log 2>&1
grep -E "^test .*FAILED|test result|panicked" $OUT/device_tests.log
wait $SP; tail -1 /tmp/synth.log
RC=${RC:-4096}
FLASH=$F ROUTE=${ROUTE-1} ROUTE_CHUNK=$RC CHUNKS=" " bash bench/cuda/sweep_session.sh 2>&1 | tail -40
grep -h "GPU plan" $OUT/*.log | head
# Without --prefill-chunk: the chunk the GPU chose (the largest that fits) and the same sweep.
timeout 200 device-bin/ds4-bench -m $M --prompt-file /tmp/prompt.txt --ctx-start 512 --ctx-max 32768 --step-mul 8 --gen-tokens 64 \
  --backend cuda --mem-limit-gb 200 --csv $OUT/cuda_flash_q2_auto.csv > $OUT/cuda_flash_q2_auto.log 2>&1
grep -h "prefill chunk\|GPU plan" $OUT/cuda_flash_q2_auto.log; cat $OUT/cuda_flash_q2_auto.csv
(cd $OUT && tar -czf /tmp/v.tgz . && rm -rf ./* && mv /tmp/v.tgz results.tgz)
