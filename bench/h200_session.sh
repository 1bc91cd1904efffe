#!/usr/bin/env bash
# One device call on an H200 for the open issues' full-Flash numbers (results packed into
# $OUT/results.tgz after every step, so a call cut short still brings back what was done):
#   1. the ds4-cuda device tests while full Flash q2 and its MTP file are synthesized;
#   2. issue 22: ds4-bench's sweep (ctx 512 -> 32768, --step-mul 8, --prefill-chunk 4096, 64 tokens) of
#      this build, and of each binary named in $ALSO (e.g. device-bin/wip-bench, another build);
#   3. issue 21: --backend vulkan and --backend cuda at ctx 4096 (4096-token chunk, 64 tokens);
#   4. issue 23: the MTP verify / draft step costs on CUDA (examples/mtp_step_costs);
#   5. issue 24: ds4-bench --concurrency 1, 2, 4, 8 (and 8 --deterministic) at ctx 4096.
# STEPS (default "tests sweep vulkan mtp batch") picks steps; FLASH the model (default: flash on a
# card over 100 GB, flash:30 on an 80 GB one).
# Prepare here: the binaries (bench/cuda/build_device_bin.sh, or the subset each step names) in
# device-bin/bins.tar.xz, the Vulkan loader in .gl (bench/wgpu/h200.sh says how).
# Run: bench/h200_session.sh (carry device-bin/bins.tar.xz and .gl)
. bench/device_prelude.sh
STEPS=${STEPS:-tests sweep vulkan mtp batch}
has() { case " $STEPS " in *" $1 "*) return 0 ;; esac; return 1; }
F=${FLASH:-$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1 | awk '{print ($1>100000)?"flash":"flash:30"}')}; M=/dev/shm/${F/:/}.gguf; MTP=/dev/shm/${F/:/}-mtp.gguf
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $OUT/gpu.txt
el "synth $F q2 (+ MTP file)"
(timeout 400 $B/ds4-gguf synth $F $M --mix q2 --mtp-out $MTP > $OUT/synth.log 2>&1) & SP=$!
if has tests; then
  DS4_TEST_DIR=/dev/shm timeout 200 $B/device-tests --nocapture --test-threads 1 > $OUT/device_tests.log 2>&1
  grep -E "^test .*FAILED|test result|panicked" $OUT/device_tests.log
fi
wait $SP; tail -1 $OUT/synth.log; el "synth done"; pack
cat README.md README.md README.md > /tmp/prompt.txt
bench() { # binary, backend, csv, log, extra flags...
  local bin=$1 be=$2 csv=$3 log=$4; shift 4
  timeout 280 $bin -m $M --prompt-file /tmp/prompt.txt --backend $be --mem-limit-gb 200 --csv $csv "$@" > $log 2>&1
  echo "exit $?" >> $log
}
if has sweep; then
  for b in $B/ds4-bench ${ALSO:-}; do
    [ -x $b ] || continue
    n=$( [ $b != $B/ds4-bench ] && echo _$(basename $b) )
    el "sweep $b"
    bench $b cuda $OUT/cuda_flash_q2$n.csv $OUT/cuda_flash_q2$n.log --ctx-start 512 --ctx-max 32768 --step-mul 8 --gen-tokens 64 --prefill-chunk 4096
    grep -h "GPU plan\|resident in\|exit" $OUT/cuda_flash_q2$n.log; cat $OUT/cuda_flash_q2$n.csv; pack
  done
fi
if has vulkan; then
  . bench/wgpu/vulkan_env.sh
  echo "backend,csv" > $OUT/vulkan_vs_cuda.csv
  for be in vulkan cuda; do
    el "$be at 4096"
    bench $B/ds4-bench $be /tmp/run.csv $OUT/bench_$be.log --ctx-start 4096 --ctx-max 4096 --gen-tokens 64 --prefill-chunk 4096
    tail -n +2 /tmp/run.csv 2>/dev/null | sed "s/^/$be,/" >> $OUT/vulkan_vs_cuda.csv; rm -f /tmp/run.csv
    grep -h "resident\|exit" $OUT/bench_$be.log | cut -c1-200; pack
  done
  cat $OUT/vulkan_vs_cuda.csv
fi
if has mtp && [ -f $MTP ]; then
  el "MTP step costs on CUDA"
  timeout 240 $B/mtp_step_costs $M --mtp $MTP --backend cuda --ctx-at 4096 --reps 7 --gen 128 2>&1 | grep -v uploading > $OUT/mtp_costs_cuda.txt
  tail -30 $OUT/mtp_costs_cuda.txt; pack
fi
if has batch; then
  echo "mode,ctx_tokens,prefill_tokens,prefill_tps,gen_tokens,gen_tps,kvcache_bytes,streams,aggregate_gen_tps,per_stream_gen_tps" > $OUT/batching.csv
  for c in 1 2 4 8 8d; do
    n=${c%d}; det=; mode=default; [ "$c" != "$n" ] && { det=--deterministic; mode=deterministic; }
    el "concurrency $c"
    r=$(timeout 150 $B/ds4-bench -m $M --prompt-file /tmp/prompt.txt --backend cuda --ctx-start 4096 --ctx-max 4096 --gen-tokens 64 \
        --prefill-chunk 4096 --mem-limit-gb 200 --concurrency $n $det 2>$OUT/batch_$c.err | grep "^4096,")
    echo "$mode,$r" | tee -a $OUT/batching.csv; pack
  done
fi
el done; pack
