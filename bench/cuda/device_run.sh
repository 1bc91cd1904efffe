#!/usr/bin/env bash
# One device call: GPU-vs-CPU tests, kernel profile on a few Flash-shaped layers, full Flash q2 benchmark.
# Binaries (stripped, carried in device-bin/): ds4-bench, ds4-gguf (cargo build --release -p ds4-cli --features cuda),
# device-tests (cargo test --release -p ds4-cuda --features cuda --no-run), engine-tests (same for -p ds4-engine
# --test cuda_pipeline), gpu_bench (cargo build --release -p ds4-cuda --features cuda --example gpu_bench).
# Usage on the lent H200 (from the repo root, binaries carried in device-bin/):
#   bench/cuda/device_run.sh [tests|profile|bench|flash4|all]...   (several modes run in order)
set -u
export DS4_WEIGHTS=mmap LD_LIBRARY_PATH=/usr/local/cuda/lib64 DS4_CUDA_INCLUDE=/usr/local/cuda/include DS4_CUDA_CACHE=/tmp/ds4cache
B=${B:-device-bin}
OUT=${OUT:-/tmp/out}
mkdir -p $OUT
T0=$(date +%s)
el() { echo "[+$(( $(date +%s) - T0 ))s] $*"; }
nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total,clocks.sm,clocks.mem --format=csv
cat README.md README.md README.md > /tmp/prompt.txt
for mode in "${@:-all}"; do
  case $mode in
  kernels)
    el "mat-vec kernels vs read bandwidth"
    timeout 120 $B/gpu_bench 50 2>&1 | tee $OUT/gpu_bench.csv ;;
  tests)
    el "device tests (ops + tiny models)"
    DS4_TEST_DIR=/dev/shm timeout ${TT:-180} $B/device-tests --nocapture --test-threads 1 2>&1 | tee $OUT/tests.log | grep -v "^$"
    # Engine-level: layers split over CUDA parts equal one stage (cargo test -p ds4-engine --features cuda --test cuda_pipeline --no-run).
    [ -x $B/engine-tests ] && timeout 120 $B/engine-tests --nocapture --test-threads 1 2>&1 | tee -a $OUT/tests.log | grep -v "^$" ;;
  flash4)
    el "flash:4 model test (64 greedy tokens vs CPU)"
    DS4_TEST_DIR=/dev/shm timeout ${FT:-420} $B/device-tests --nocapture --test-threads 1 --ignored ${FILTER:-flash4} 2>&1 | tee $OUT/tests_flash.log | grep -v "^$" ;;
  profile)
    el "synth flash:${PL:-6} q2"
    [ -f /dev/shm/flash${PL:-6}.gguf ] || timeout 240 $B/ds4-gguf synth flash:${PL:-6} /dev/shm/flash${PL:-6}.gguf --mix q2 2>&1 | tail -1
    el "profile (ctx 4096, CUDA events per kernel; prefill and decode separately)"
    DS4_CUDA_PROFILE=1 timeout ${PROF_T:-120} $B/ds4-bench -m /dev/shm/flash${PL:-6}.gguf --prompt-file /tmp/prompt.txt --ctx-start 4096 --ctx-max 4096 \
      --gen-tokens 16 --prefill-chunk 4096 --backend cuda --mem-limit-gb 200 --csv $OUT/profile.csv 2>&1 | tee $OUT/profile.log | grep -v "uploading weights"
    el "unprofiled (same shape)"
    timeout ${PROF_T:-120} $B/ds4-bench -m /dev/shm/flash${PL:-6}.gguf --prompt-file /tmp/prompt.txt --ctx-start 512 --ctx-max 4096 --step-mul 8 \
      --gen-tokens 32 --prefill-chunk 4096 --backend cuda --mem-limit-gb 200 --csv $OUT/small.csv 2>&1 | grep -v "uploading weights" | grep -E "ctx|t/s"
    cat $OUT/small.csv ;;
  ab)
    # Decode A/B of engine switches on flash:PL at ctx 4096 (one line per setting: env, prefill t/s, decode t/s).
    [ -f /dev/shm/flash${PL:-6}.gguf ] || timeout 240 $B/ds4-gguf synth flash:${PL:-6} /dev/shm/flash${PL:-6}.gguf --mix q2 2>&1 | tail -1
    for setting in ${AB:-"X=1" "DS4_CUDA_HOSTTIME=1"}; do
      env ${setting//,/ } timeout 120 $B/ds4-bench -m /dev/shm/flash${PL:-6}.gguf --prompt-file /tmp/prompt.txt --ctx-start 4096 --ctx-max 4096 \
        --gen-tokens ${GEN:-64} --prefill-chunk 4096 --backend cuda --mem-limit-gb 200 > /tmp/ab_run.log 2>&1
      r=$(grep -E "^4096," /tmp/ab_run.log | tail -1)
      echo "ab $setting: ${r:-FAILED: $(grep -v "uploading weights" /tmp/ab_run.log | tail -2 | tr '\n' ' ')}" | tee -a $OUT/ab.log
      grep "^host time" /tmp/ab_run.log | tail -1 | tee -a $OUT/ab.log
    done ;;
  bench)
    rm -f /dev/shm/flash[0-9]*.gguf
    el "synth flash (43 layers) q2"
    [ -f /dev/shm/flash.gguf ] || timeout 300 $B/ds4-gguf synth flash /dev/shm/flash.gguf --mix q2 2>&1 | tail -1
    free -g | head -2
    el "bench"
    timeout ${BENCH_T:-300} $B/ds4-bench -m /dev/shm/flash.gguf --prompt-file /tmp/prompt.txt --ctx-start 512 --ctx-max 32768 --step-mul 8 \
      --gen-tokens 32 --prefill-chunk 4096 --backend cuda --mem-limit-gb 200 --csv $OUT/cuda_flash_q2.csv 2>&1 | tee $OUT/bench.log | grep -v "uploading weights"
    echo "bench rc=${PIPESTATUS[0]}"
    cat $OUT/cuda_flash_q2.csv ;;
  esac
done
el done
