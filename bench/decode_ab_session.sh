#!/usr/bin/env bash
# One device call: a CUDA decode change checked and measured against the base build, results packed
# into $OUT/results.tgz after every step:
#   1. this build's ds4-cuda device tests, then the engine's CUDA MTP and batch tests
#      (engine-*-tests, when carried), while the model and its MTP file are synthesized;
#   2. decode t/s at ctx $CTX (default 4096; one prompt chunk, $GEN tokens), base and this build
#      interleaved, $ROUNDS rounds (default "1 2 3"), this build once per environment setting in
#      $VARIANTS (default X=1: none; e.g. "X=1 DS4_X_SWITCH=1" for a measuring switch) -> $OUT/decode_ab.csv;
#   3. unless NO_MTP=1, both builds' MTP verify-step costs (mtp_step_costs, median of 7);
#   4. unless NO_BATCH=1, both builds' aggregate decode at --concurrency $STREAMS (default 8).
# FLASH picks the model (default: full Flash on a card over 100 GB, flash:12 on an 80 GB one).
# Prepare here: BASE=<commit> bench/build_ab_bins.sh. Run: bench/decode_ab_session.sh (carry device-bin/bins.tar.xz)
. bench/device_prelude.sh
BIG=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1 | awk '{print ($1>100000)?1:0}')
F=${FLASH:-$([ $BIG = 1 ] && echo flash || echo flash:12)}; M=/dev/shm/${F/:/}.gguf; MTP=/dev/shm/${F/:/}-mtp.gguf
C=${CTX:-4096}; G=${GEN:-64}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $OUT/gpu.txt
el "synth $F (+ MTP file)"
(timeout 400 $B/ds4-gguf synth $F $M --mix q2 --mtp-out $MTP > $OUT/synth.log 2>&1) & SP=$!
DS4_TEST_DIR=/dev/shm timeout 240 $B/device-tests --nocapture --test-threads 1 > $OUT/device_tests.log 2>&1
grep -E "^test .*FAILED|test result|panicked" $OUT/device_tests.log
for t in $B/engine-*-tests; do
  [ -x $t ] || continue
  timeout 200 $t --test-threads 1 > $OUT/$(basename $t).log 2>&1
  echo "$(basename $t): $(grep -E "test result|FAILED|panicked" $OUT/$(basename $t).log | head -3 | tr '\n' ' ')"
done
el "tests done"; pack
wait $SP; tail -1 $OUT/synth.log; el "synth done"
cat README.md README.md README.md > /tmp/prompt.txt
# tag, binary, extra flags: one ds4-bench run at ctx $C (environment $ENVV, e.g. a measuring switch); its
# CSV row (after the tag) into $OUT/decode_ab.csv.
run() {
  local tag=$1 bin=$2; shift 2
  env ${ENVV:-X=1} timeout 150 $bin -m $M --prompt-file /tmp/prompt.txt --backend cuda --ctx-start $C --ctx-max $C --gen-tokens ${GR:-$G} \
    --prefill-chunk $C --mem-limit-gb 200 --csv /tmp/run.csv "$@" > $OUT/run_$tag.log 2>&1
  echo "$tag,$(tail -n +2 /tmp/run.csv 2>/dev/null | head -1)" | tee -a $OUT/decode_ab.csv; rm -f /tmp/run.csv
}
echo "tag,ctx_tokens,prefill_tokens,prefill_tps,gen_tokens,gen_tps,kvcache_bytes" > $OUT/decode_ab.csv
for r in ${ROUNDS:-1 2 3}; do
  run base_$r $B/base-bench
  for v in ${VARIANTS:-X=1}; do ENVV=$v run new_${v%%=*}_$r $B/ds4-bench; done
  pack
done
el "decode A/B done"
if [ -z "${NO_MTP:-}" ]; then
  for b in base-mtp_step_costs mtp_step_costs; do
    timeout 150 $B/$b $M --mtp $MTP --backend cuda --ctx-at $C --reps 7 2>&1 | grep -v uploading > $OUT/mtp_costs_$b.txt
    echo "$b:"; grep -E "^plain|^[1-5] [|]|^MTP draft" $OUT/mtp_costs_$b.txt
  done
  el "MTP step costs done"; pack
fi
if [ -z "${NO_BATCH:-}" ]; then
  S=${STREAMS:-8}
  GR=32 run base_c$S $B/base-bench --concurrency $S
  GR=32 run new_c$S $B/ds4-bench --concurrency $S
  el "batch done"
fi
cat $OUT/decode_ab.csv; el done; pack
