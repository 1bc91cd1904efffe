#!/usr/bin/env bash
# One device call: where a real decode step's time goes, measured in the CUDA graph itself (not
# under Nsight, which serializes the side streams and locks clocks): decode t/s and host time per
# step of this build (device-bin/ds4-bench) with each kernel set of $SETS left out of one-token steps
# (DS4_CUDA_SKIP, names joined by +; results are wrong, the time is what counts), a plain run before and after. Then,
# unless NO_AB=1, this build (once per environment setting in $VARIANTS, default X=1) against
# device-bin/base-bench interleaved, $ROUNDS rounds, at ctx $CTX. Results in $OUT/results.tgz ($OUT/skip.csv, $OUT/ab.csv).
# FLASH picks the model (default flash:12). Prepare here: BASE=<commit> bench/build_ab_bins.sh.
. bench/device_prelude.sh
F=${FLASH:-flash:12}; M=/dev/shm/${F/:/}.gguf; C=${CTX:-4096}; G=${GEN:-66}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $OUT/gpu.txt
el "synth $F"
[ -f $M ] || timeout 400 $B/ds4-gguf synth $F $M --mix q2 > $OUT/synth.log 2>&1
el "synth done"
cat README.md README.md README.md > /tmp/prompt.txt
run() { # tag, binary, env...
  local tag=$1 bin=$2; shift 2
  env DS4_CUDA_HOSTTIME=1 "$@" timeout 120 $bin -m $M --prompt-file /tmp/prompt.txt --backend cuda --ctx-start $C --ctx-max $C \
    --gen-tokens $G --prefill-chunk $C --mem-limit-gb 200 --csv /tmp/run.csv > $OUT/run_$tag.log 2>&1
  local host=$(grep -h "host time per step" $OUT/run_$tag.log | tail -1 | sed 's/.*wall \([0-9.]*\) us.*/\1/')
  echo "$tag,$(tail -n +2 /tmp/run.csv 2>/dev/null | head -1 | cut -d, -f5),$host" | tee -a $OUT/$CSV; rm -f /tmp/run.csv
}
SETS=${SETS:-"hc_entry_dec hc_comb mvq8_iq2s_n1 mvq8_q2_k_n1 mvq8_q8p_r4 mvq8_q8p_r1+mvq8_q8p_r2 attn_dec+attn_dec_merge norm_rope_qat+rms_rows swiglu+q80_quant idx_scores+idx_topk mv4_f16_n1+comp_seq+scale_inplace mvq8_q8s_n1+argmax_row+head_collapse+embed"}
CSV=skip.csv; echo "skipped,gen_tps,host_wall_us_per_step" > $OUT/$CSV
run none $B/ds4-bench
for s in $SETS; do run $s $B/ds4-bench DS4_CUDA_SKIP=${s//+/,}; done
run none_again $B/ds4-bench
el "skips done"; pack
if [ -z "${NO_AB:-}" ]; then
  CSV=ab.csv; echo "tag,gen_tps,host_wall_us_per_step" > $OUT/$CSV
  for r in ${ROUNDS:-1 2 3}; do
    run base_$r $B/base-bench
    for v in ${VARIANTS:-X=1}; do run new_${v%%=*}_$r $B/ds4-bench $v; done
  done
  el "A/B done"
fi
cat $OUT/skip.csv $OUT/ab.csv 2>/dev/null; el done; pack
