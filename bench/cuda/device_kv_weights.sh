#!/usr/bin/env bash
# One device call for issue 27 items 6-7 on the lent H200: every device test (nothing regressed, and the
# new ones: host-mapped weights, CUDA session save/restore), flash:4 with --cuda-weights host against the
# device copy (test + ds4-bench + ds4 greedy text), and ds4 --kv-save/--kv-load across CPU and CUDA.
# Binaries from bench/cuda/build_device_bin.sh, carried in $B (default device-bin); logs in $OUT (at most 8
# files come back from a device call: tests.log, engine_tests.log, flash4_host.log, bench.log, ds4.log,
# server.log, 2 CSVs).
set -u
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 DS4_CUDA_INCLUDE=/usr/local/cuda/include DS4_CUDA_CACHE=/tmp/ds4cache DS4_WEIGHTS=mmap
B=${B:-device-bin}
OUT=${OUT:-/tmp/out}
mkdir -p $OUT
T0=$(date +%s)
el() { echo "[+$(( $(date +%s) - T0 ))s] $*"; }
nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv
cat README.md README.md > /tmp/prompt.txt
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  el "device tests (ops + tiny models; includes the host-weights ones)"
  DS4_TEST_DIR=/dev/shm timeout ${TT:-240} $B/device-tests --nocapture --test-threads 1 > $OUT/tests.log 2>&1
  echo "device-tests rc=$?"
  grep -E "^test |test result|weights (Device|Host)|GiB of GPU memory|tokens identical" $OUT/tests.log
  el "engine tests (CUDA parts, session save/restore, CPU<->CUDA files)"
  timeout ${ET:-180} $B/engine-tests --nocapture --test-threads 1 > $OUT/engine_tests.log 2>&1
  echo "engine-tests rc=$?"
  grep -E "^test |test result|restored at|continued on" $OUT/engine_tests.log
fi
if [ "${SKIP_FLASH_TEST:-0}" != 1 ]; then
  el "flash:4 q2: host-mapped weights vs the device copy (device test)"
  DS4_TEST_DIR=/dev/shm timeout ${FT:-300} $B/device-tests --nocapture --test-threads 1 --ignored flash4_q2_host > $OUT/flash4_host.log 2>&1
  echo "flash4 host test rc=$?"
  grep -E "^test |test result|GiB|plan|identical|device:|host:|panicked" $OUT/flash4_host.log
fi
# The CLI runs need a tokenizer: the test's file has none, ds4-gguf synth writes one.
M=/dev/shm/flash4.gguf
el "synth flash:4 q2 (with tokenizer)"
[ -f $M ] || timeout 240 $B/ds4-gguf synth flash:4 $M --mix q2 2>&1 | tail -1
el "ds4-bench flash:4 ctx 512, device copy vs host-mapped"
for w in device host; do
  timeout 150 $B/ds4-bench -m $M --prompt-file /tmp/prompt.txt --ctx-start 512 --ctx-max 512 --gen-tokens 32 --prefill-chunk 512 \
    --backend cuda --cuda-weights $w --mem-limit-gb 200 --csv $OUT/bench_$w.csv > /tmp/bench_$w.log 2>&1
  echo "bench $w rc=$?" | tee -a $OUT/bench.log
  grep -v uploading /tmp/bench_$w.log >> $OUT/bench.log
  grep -v uploading /tmp/bench_$w.log | grep -E "cuda:|t/s|error" | head -8
  cat $OUT/bench_$w.csv
done
el "ds4 greedy text on flash:4, device copy vs host-mapped (engine defaults, then --quality: f32 activations on both)"
for fast in 1 0; do
  q=""; [ $fast = 0 ] && q="--quality"
  for w in device host; do
    timeout 120 $B/ds4 -m $M --backend cuda --cuda-weights $w $q -p "The history of the river" -n 48 --temp 0 --nothink --ctx 4096 > /tmp/ds4_${w}_$fast.txt 2> /tmp/ds4_${w}_$fast.err
    echo "ds4 $w ${q:-default} rc=$?"
    grep -E "GPU plan|free of|registered|memory:" /tmp/ds4_${w}_$fast.err
    (echo "== ds4 flash:4 --cuda-weights $w ${q:-default}: stderr"; grep -v uploading /tmp/ds4_${w}_$fast.err; echo "== stdout"; cat /tmp/ds4_${w}_$fast.txt) >> $OUT/ds4.log
  done
  [ -s /tmp/ds4_device_$fast.txt ] && cmp /tmp/ds4_device_$fast.txt /tmp/ds4_host_$fast.txt && echo "ds4 greedy text identical (device copy vs host-mapped, ${q:-default})" | tee -a $OUT/ds4.log
done
el "ds4 --kv-save on CUDA, --kv-load on CPU and on CUDA (embedded tiny model)"
rm -f /tmp/g.kv /tmp/c.kv
timeout 60 $B/ds4 --backend cuda -p "Hello there, tell me a story" -n 12 --temp 0 --nothink --ctx 1024 --kv-save /tmp/g.kv > /tmp/kv_save_cuda.txt 2> /tmp/kv_save_cuda.err; echo "save on cuda rc=$?"
timeout 60 $B/ds4 --backend cpu -p "Hello there, tell me a story" -n 12 --temp 0 --nothink --ctx 1024 --kv-save /tmp/c.kv > /tmp/kv_save_cpu.txt 2> /tmp/kv_save_cpu.err; echo "save on cpu rc=$?"
for f in g c; do for b in cpu cuda; do
  timeout 60 $B/ds4 --backend $b --kv-load /tmp/$f.kv -p "And then?" -n 12 --temp 0 --nothink --ctx 1024 > /tmp/kv_load_${f}_$b.txt 2> /tmp/kv_load_${f}_$b.err
  echo "load $f.kv on $b rc=$? $(grep -c WARNING /tmp/kv_load_${f}_$b.err) warnings"
done; done
ls -la /tmp/g.kv /tmp/c.kv
for x in /tmp/kv_save_*.txt /tmp/kv_save_*.err /tmp/kv_load_*.txt /tmp/kv_load_*.err; do echo "== $x"; grep -v uploading $x | tail -20; done >> $OUT/ds4.log
grep -A3 "kv_load_.*txt" $OUT/ds4.log | head -40
if [ -x $B/ds4-server ] && [ "${SKIP_SERVER:-0}" != 1 ]; then
  el "ds4-server --backend cuda --kv-disk-dir: restart, restore, same answers (bench/cuda/server_kv_disk_cuda.py)"
  timeout 300 python3 ${SERVER_PY:-bench/cuda/server_kv_disk_cuda.py} $B/ds4-server /tmp/skv 2>&1 | tee $OUT/server.log
  echo "server check rc=${PIPESTATUS[0]}"
fi
el done
