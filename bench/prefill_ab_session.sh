#!/usr/bin/env bash
# One device call: a CUDA prefill A/B of this build (device-bin/ds4-bench) against the base build
# (device-bin/base-bench), results packed into $OUT/results.tgz after every step:
#   1. this build's ds4-cuda device tests (device-bin/device-tests) while the model is synthesized;
#   2. one prompt chunk of each size in $CHUNKS (default "512 4096"; ctx = chunk, $GEN tokens), base and
#      this build interleaved, $ROUNDS rounds (default "1 2") -> $OUT/ab.csv;
#   3. each build's per-kernel prefill profile at each chunk size (DS4_CUDA_PROFILE=1) unless NO_PROFILE=1;
#   4. on a card over 100 GB (full Flash), issue 22's sweep of both builds (ctx 512 -> 32768,
#      --step-mul 8, --prefill-chunk 4096, 64 tokens) unless NO_SWEEP=1.
# FLASH picks the model (default: full Flash on a card over 100 GB, flash:12 on an 80 GB one).
# Prepare here: BASE=<commit> bench/build_ab_bins.sh. Run: bench/prefill_ab_session.sh (carry device-bin/bins.tar.xz)
. bench/device_prelude.sh
BIG=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1 | awk '{print ($1>100000)?1:0}')
F=${FLASH:-$([ $BIG = 1 ] && echo flash || echo flash:12)}; M=/dev/shm/${F/:/}.gguf; G=${GEN:-16}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $OUT/gpu.txt
el "synth $F"
(timeout 400 $B/ds4-gguf synth $F $M --mix q2 > $OUT/synth.log 2>&1) & SP=$!
DS4_TEST_DIR=/dev/shm timeout 240 $B/device-tests --nocapture --test-threads 1 > $OUT/device_tests.log 2>&1
grep -E "^test .*FAILED|test result|panicked" $OUT/device_tests.log
el "device tests done"; pack
wait $SP; tail -1 $OUT/synth.log; el "synth done"
cat README.md README.md README.md > /tmp/prompt.txt
run() { # tag, binary, chunk, env...
  local tag=$1 bin=$2 c=$3; shift 3
  env "$@" timeout 200 $bin -m $M --prompt-file /tmp/prompt.txt --backend cuda --ctx-start $c --ctx-max $c --gen-tokens $G \
    --prefill-chunk $c --mem-limit-gb 200 --csv /tmp/run.csv > $OUT/run_$tag.log 2>&1
  echo "$tag,$(tail -n +2 /tmp/run.csv 2>/dev/null | head -1)" | tee -a $OUT/ab.csv; rm -f /tmp/run.csv
}
echo "tag,ctx_tokens,prefill_tokens,prefill_tps,gen_tokens,gen_tps,kvcache_bytes" > $OUT/ab.csv
for r in ${ROUNDS:-1 2}; do
  for c in ${CHUNKS:-512 4096}; do run base_${c}_$r $B/base-bench $c X=1; run new_${c}_$r $B/ds4-bench $c X=1; done; pack
done
el "A/B done"
[ -z "${NO_PROFILE:-}" ] && for c in ${CHUNKS:-512 4096}; do
  for b in base-bench ds4-bench; do
    run prof_${b}_$c $B/$b $c DS4_CUDA_PROFILE=1 >/dev/null; grep -v uploading $OUT/run_prof_${b}_$c.log > $OUT/profile_${b}_$c.txt
  done
done
el "profiles done"; pack
if [ $BIG = 1 ] && [ -z "${NO_SWEEP:-}" ]; then
  for b in ds4-bench base-bench; do
    el "sweep $b"
    timeout 280 $B/$b -m $M --prompt-file /tmp/prompt.txt --backend cuda --mem-limit-gb 200 --csv $OUT/sweep_$b.csv \
      --ctx-start 512 --ctx-max 32768 --step-mul 8 --gen-tokens 64 --prefill-chunk 4096 > $OUT/sweep_$b.log 2>&1
    grep -h "GPU plan\|resident in" $OUT/sweep_$b.log; cat $OUT/sweep_$b.csv; pack
  done
fi
cat $OUT/ab.csv; el done; pack
