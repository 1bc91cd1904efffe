#!/usr/bin/env bash
# One device call (or the tail of one): a wgpu change checked and measured through Vulkan against the
# base build, results packed into $OUT/results.tgz after every step:
#   1. this build's wgpu op and stage tests on the GPU;
#   2. decode and prefill at ctx 4096 (one 4096-token chunk, $GEN tokens) through --backend vulkan,
#      base-bench and this build interleaved, $VK_ROUNDS rounds (default "1 2"), this build once more
#      per setting in $VK_ENV (e.g. "DS4_X_SWITCH=1": a measuring switch) -> $OUT/vk_ab.csv;
#   3. with PROFILE=1, the per-op profile (DS4_WGPU_PROFILE=1) of both builds.
# FLASH picks the model (default flash:12; reused from /dev/shm when a call before made it).
# Prepare here: BASE=<commit> bench/build_ab_bins.sh, the Vulkan loader in .gl (bench/wgpu/h200.sh).
# Run: bench/vk_ab_session.sh (carry device-bin/bins.tar.xz and .gl)
. bench/device_prelude.sh
F=${FLASH:-flash:12}; M=/dev/shm/${F/:/}.gguf; G=${GEN:-32}
[ -f $M ] || { el "synth $F"; timeout 300 $B/ds4-gguf synth $F $M --mix q2 > $OUT/vk_synth.log 2>&1; }
. bench/wgpu/vulkan_env.sh
for t in $B/wgpu-*-tests; do
  [ -x $t ] && timeout 150 $t --test-threads 1 > $OUT/vk_$(basename $t).log 2>&1
  echo "$(basename $t): $(grep -hE "test result|FAILED|panicked" $OUT/vk_$(basename $t).log | head -3 | tr '\n' ' ')"
done
el "wgpu tests done"; pack
cat README.md README.md README.md > /tmp/prompt.txt
run() { # tag, binary, env...
  local tag=$1 bin=$2; shift 2
  env "$@" timeout 200 $bin -m $M --prompt-file /tmp/prompt.txt --backend vulkan --ctx-start 4096 --ctx-max 4096 --gen-tokens $G \
    --prefill-chunk 4096 --mem-limit-gb 200 --csv /tmp/run.csv > $OUT/vk_run_$tag.log 2>&1
  echo "$tag,$(tail -n +2 /tmp/run.csv 2>/dev/null | head -1)" | tee -a $OUT/vk_ab.csv; rm -f /tmp/run.csv
}
echo "tag,ctx_tokens,prefill_tokens,prefill_tps,gen_tokens,gen_tps,kvcache_bytes" > $OUT/vk_ab.csv
for r in ${VK_ROUNDS:-1 2}; do
  run base_$r $B/base-bench X=1
  run new_$r $B/ds4-bench X=1
  for e in ${VK_ENV:-}; do run ${e%%=*}_$r $B/ds4-bench $e; done
  pack
done
el "Vulkan A/B done"
if [ -n "${PROFILE:-}" ]; then
  for b in base-bench ds4-bench; do
    DS4_WGPU_PROFILE=1 timeout 150 $B/$b -m $M --prompt-file /tmp/prompt.txt --ctx-start 4096 --ctx-max 4096 --gen-tokens 16 \
      --prefill-chunk 4096 --backend vulkan 2>&1 | grep -v uploading > $OUT/vk_profile_$b.txt
  done
  el "profiles done"
fi
cat $OUT/vk_ab.csv; el done; pack
