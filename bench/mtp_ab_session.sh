#!/usr/bin/env bash
# One device call: the MTP verify-step costs of this build (device-bin/mtp_step_costs) against the
# base build's (device-bin/base-mtp_step_costs), results packed into $OUT/results.tgz after every step:
#   1. this build's ds4-cuda device tests while the model and its MTP file are synthesized;
#   2. both builds' step costs (plain decode step, verify steps of 1..5 tokens, the draft step and the
#      rates they give; median of 7) interleaved, $ROUNDS rounds (default "1 2") -> mtp_costs_<build>_<round>.txt;
#   3. unless NO_NCU=1 or full Flash, this build's verify steps kernel by kernel (bench/cuda/ncu_verify.sh).
# FLASH picks the model (default: full Flash on a card over 100 GB, flash:12 on an 80 GB one).
# Prepare here: BASE=<commit> bench/build_ab_bins.sh. Run: bench/mtp_ab_session.sh (carry device-bin/bins.tar.xz)
. bench/device_prelude.sh
BIG=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1 | awk '{print ($1>100000)?1:0}')
F=${FLASH:-$([ $BIG = 1 ] && echo flash || echo flash:12)}; M=/dev/shm/${F/:/}.gguf; MTP=/dev/shm/${F/:/}-mtp.gguf
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $OUT/gpu.txt
el "synth $F (+ MTP file)"
(timeout 400 $B/ds4-gguf synth $F $M --mix q2 --mtp-out $MTP > $OUT/synth.log 2>&1) & SP=$!
DS4_TEST_DIR=/dev/shm timeout 240 $B/device-tests --nocapture --test-threads 1 > $OUT/device_tests.log 2>&1
grep -E "^test .*FAILED|test result|panicked" $OUT/device_tests.log
el "device tests done"; pack
wait $SP; tail -1 $OUT/synth.log; el "synth done"
for r in ${ROUNDS:-1 2}; do
  for b in base-mtp_step_costs mtp_step_costs; do
    timeout 150 $B/$b $M --mtp $MTP --backend cuda --ctx-at 4096 --reps 7 2>&1 | grep -v uploading > $OUT/mtp_costs_${b}_$r.txt
    echo "$b round $r:"; grep -E "^plain|^[1-5] [|]|^MTP draft|^[12] [|] 0.8" $OUT/mtp_costs_${b}_$r.txt
  done
  pack
done
el "step costs done"
if [ -z "${NO_NCU:-}" ] && [ "$F" != flash ]; then
  L=${F#flash:} CTX=4096 T=200 OUT=$OUT bench/cuda/ncu_verify.sh | tail -32
fi
el done; pack
