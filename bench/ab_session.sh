#!/usr/bin/env bash
# One device call, two A/Bs on the same synthetic Flash q2 file ($FLASH, default flash:12), results
# packed into $OUT/results.tgz after every step:
#  - CUDA kernels: device-bin/wip-bench (a build with candidate kernels; its device tests
#    device-bin/wip-device-tests run first) against device-bin/ds4-bench, interleaved at ctx 4096
#    (one 4096-token chunk, $GEN tokens), then each one's per-kernel prefill profile;
#  - wgpu through Vulkan: device-bin/base-bench (before) against device-bin/ds4-bench (after), and
#    the latter with each value of $VK_ENV (e.g. "DS4_SOME_SWITCH=0 DS4_SOME_SWITCH=1": a switch under test),
#    interleaved, then per-op profiles (DS4_WGPU_PROFILE=1) of before and after; the wgpu tests
#    (device-bin/wgpu-*-tests) on the GPU first;
#  - kernel_bench (and base-kernel_bench: the base build's, interleaved) and gpu_bench (when carried):
#    the wgpu and the CUDA kernels alone;
#  - time allowing (started before $MTP_BEFORE_S, default 400 s), the MTP verify / draft step costs
#    and their per-kernel profile (device-bin/mtp_step_costs, a synthetic MTP file).
# Prepare here: the binaries in device-bin/bins.tar.xz, the Vulkan loader in .gl (bench/wgpu/h200.sh).
# NO_PROFILE=1 leaves the profiles out, VK_ROUNDS (default "1 2") sets the Vulkan rounds; BATCH_DIAG=1
# adds CUDA batched decode at 1..8 streams and the per-kernel profiles of 1 and 2 streams.
# Run: bench/ab_session.sh (carry device-bin/bins.tar.xz and .gl)
. bench/device_prelude.sh
F=${FLASH:-flash:12}; M=/dev/shm/${F/:/}.gguf; G=${GEN:-32}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $OUT/gpu.txt
el "synth $F"
MTP=/dev/shm/${F/:/}-mtp.gguf
(timeout 300 $B/ds4-gguf synth $F $M --mix q2 --mtp-out $MTP > $OUT/synth.log 2>&1) & SP=$!
. bench/wgpu/vulkan_env.sh
for t in $B/wgpu-*-tests; do
  [ -x $t ] && timeout 150 $t --test-threads 1 --nocapture > $OUT/$(basename $t).log 2>&1
  grep -hE "test result|FAILED|panicked|Vulkan\)" $OUT/$(basename $t).log | head -5
done
el "wgpu tests done"
if [ -x $B/kernel_bench ]; then  # each wgpu kernel alone at the Flash shapes (crates/wgpu/examples/wgpu_kernel_bench.rs)
  # With the base build's (base-kernel_bench): base, this build, base again (the clocks settle first).
  [ -x $B/base-kernel_bench ] && timeout 100 $B/base-kernel_bench 100 > $OUT/kernels_vulkan_base.csv 2>&1
  timeout 100 $B/kernel_bench 100 > $OUT/kernels_vulkan.csv 2>&1
  if [ -x $B/base-kernel_bench ]; then
    timeout 100 $B/base-kernel_bench 100 > $OUT/kernels_vulkan_base2.csv 2>&1
    paste -d, $OUT/kernels_vulkan_base.csv $OUT/kernels_vulkan.csv $OUT/kernels_vulkan_base2.csv | cut -d, -f1,3,7,11 | head -40
  else grep -v "@s" $OUT/kernels_vulkan.csv | head -40; fi
  el "kernel_bench done"; pack
fi
if [ -x $B/wip-device-tests ]; then
  DS4_TEST_DIR=/dev/shm timeout 200 $B/wip-device-tests --nocapture --test-threads 1 > $OUT/wip_device_tests.log 2>&1
  grep -E "^test .*FAILED|test result|panicked" $OUT/wip_device_tests.log
fi
el "device tests done"; pack
if [ -x $B/gpu_bench ]; then  # kernel and GEMM timings alone (crates/cuda/examples/gpu_bench.rs)
  timeout 150 $B/gpu_bench > $OUT/gpu_bench.txt 2>&1; grep -E "^gemm|^read" $OUT/gpu_bench.txt; el "gpu_bench done"; pack
fi
wait $SP; tail -1 $OUT/synth.log
cat README.md README.md README.md > /tmp/prompt.txt
run() { # tag, backend, binary, env...
  local tag=$1 be=$2 bin=$3; shift 3
  env "$@" timeout 200 $bin -m $M --prompt-file /tmp/prompt.txt --backend $be --ctx-start 4096 --ctx-max 4096 --gen-tokens $G \
    --prefill-chunk 4096 --mem-limit-gb 200 --csv /tmp/run.csv > $OUT/run_$tag.log 2>&1
  echo "$tag,$(tail -n +2 /tmp/run.csv 2>/dev/null | head -1)" | tee -a $OUT/ab.csv; rm -f /tmp/run.csv
}
echo "tag,ctx_tokens,prefill_tokens,prefill_tps,gen_tokens,gen_tps,kvcache_bytes" > $OUT/ab.csv
if [ -x $B/wip-bench ]; then
  for r in 1 2; do run cuda_main_$r cuda $B/ds4-bench X=1; run cuda_wip_$r cuda $B/wip-bench X=1; done; pack
  [ -z "${NO_PROFILE:-}" ] && for b in ds4-bench wip-bench; do
    DS4_CUDA_PROFILE=1 timeout 120 $B/$b -m $M --prompt-file /tmp/prompt.txt --ctx-start 4096 --ctx-max 4096 --gen-tokens 4 \
      --prefill-chunk 4096 --backend cuda 2>&1 | grep -v uploading > $OUT/profile_cuda_$b.txt
  done
  el "CUDA A/B done"; pack
fi
if [ -x $B/base-bench ]; then
  for r in ${VK_ROUNDS:-1 2}; do
    run vk_base_$r vulkan $B/base-bench X=1
    run vk_new_$r vulkan $B/ds4-bench X=1
    for e in ${VK_ENV:-}; do run vk_${e#*=}_$r vulkan $B/ds4-bench $e; done
    pack
  done
  [ -z "${NO_PROFILE:-}" ] && for b in base-bench ds4-bench; do
    DS4_WGPU_PROFILE=1 timeout 150 $B/$b -m $M --prompt-file /tmp/prompt.txt --ctx-start 4096 --ctx-max 4096 --gen-tokens 16 \
      --prefill-chunk 4096 --backend vulkan 2>&1 | grep -v uploading > $OUT/profile_vulkan_$b.txt
  done
  el "Vulkan A/B done"
fi
if [ -n "${BATCH_DIAG:-}" ]; then
  # Issue 24's batched step on CUDA at this file's size: aggregate rates at 1, 2, 4, 8 streams (2 also
  # --deterministic), then the per-kernel profile of 1 and 2 streams (launch by launch, no graphs).
  el "batch diagnosis"
  batch_rates $M 32 "1 2 2d 4 8"
  for n in 1 2; do
    DS4_CUDA_PROFILE=1 timeout 100 $B/ds4-bench -m $M --prompt-file /tmp/prompt.txt --backend cuda --ctx-start 4096 --ctx-max 4096 --gen-tokens 8 \
      --prefill-chunk 4096 --mem-limit-gb 200 --concurrency $n 2>&1 | grep -v uploading > $OUT/batch_profile_$n.txt
  done
  el "batch diagnosis done"; pack
fi
if [ -x $B/mtp_step_costs ] && [ $(( $(date +%s) - T0 )) -lt ${MTP_BEFORE_S:-400} ]; then
  # What a verify step of 1..5 rows adds to a decode step, kernel by kernel (no graphs: each launch timed).
  el "MTP verify profile"
  DS4_CUDA_PROFILE=1 timeout 100 $B/mtp_step_costs $M --mtp $MTP --backend cuda --ctx-at 4096 --reps 2 2>&1 | grep -v uploading > $OUT/mtp_profile.txt
  timeout 100 $B/mtp_step_costs $M --mtp $MTP --backend cuda --ctx-at 4096 --reps 7 2>&1 | grep -v uploading > $OUT/mtp_costs.txt
  grep -E "^plain|^[1-5] [|]|^MTP draft" $OUT/mtp_costs.txt
fi
cat $OUT/ab.csv; el done; pack
