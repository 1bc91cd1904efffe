#!/usr/bin/env bash
# One device call for MTP on CUDA (results under $OUT):
#  1. the MTP engine tests on CUDA (greedy identity with speculation; the GPU drafter against the CPU
#     block) -> mtp_tests.log;
#  2. the Flash-shaped verify-rows test (flash:4, --ignored) -> verify_flash4.log;
#  3. (with device-bin/old-mtp.xz, the previous build's mtp_step_costs, first; mid-mtp.xz an
#     intermediate build's, next) the verify / draft step costs on $FLASH (default flash:30, which fits an 80 GB card; the full
#     43 layers need an H200) with a synthetic MTP file, at ctx 4096, on CUDA (and Vulkan with
#     VULKAN=1), and end to end: $GEN (default 128) greedy tokens plain and speculative with drafts
#     right at a set rate -> mtp_costs_cuda.txt, mtp_costs_vulkan.txt.
#  (DEVICE_TESTS=1: the ds4-cuda device tests run beside step 1 -> device_tests.log.)
#  4. with PROFILE=1: per-kernel times of each verify step size -> mtp_profile.txt; with NCU=1 the
#     Nsight Compute durations by row count (bench/cuda/ncu_verify.sh) -> ncu_verify.txt. PACK=1 packs
#     $OUT into one results.tgz.
# Prepare: bench/cuda/build_device_bin.sh (and the Vulkan loader in .gl for VULKAN=1).
# Run: tar -xJf device-bin/bins.tar.xz && bench/cuda/mtp_session.sh
set -u
OUT=${OUT:-/tmp/out}; B=${B:-device-bin}; FLASH=${FLASH:-flash:30}
mkdir -p $OUT
export DS4_WEIGHTS=mmap LD_LIBRARY_PATH=/usr/local/cuda/lib64 DS4_CUDA_INCLUDE=/usr/local/cuda/include DS4_CUDA_CACHE=/tmp/ds4cache
T0=$(date +%s); el() { echo "[+$(( $(date +%s) - T0 ))s] $*"; }
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
M=/dev/shm/${FLASH/:/}.gguf; MTP=/dev/shm/${FLASH/:/}-mtp.gguf
SP=
[ -f $M ] || { timeout 400 $B/ds4-gguf synth $FLASH $M --mix q2 --mtp-out $MTP > /tmp/synth.log 2>&1 & SP=$!; }
DT=
if [ -n "${DEVICE_TESTS:-}" ]; then
  # The ds4-cuda device tests beside the engine tests (correctness only; both done before any timing).
  (DS4_TEST_DIR=/dev/shm timeout 300 $B/device-tests --test-threads 1 > $OUT/device_tests.log 2>&1) & DT=$!
fi
el "MTP engine tests on CUDA"
for t in engine-mtp-tests engine-drafter-tests; do
  timeout 150 $B/$t --nocapture --test-threads 1 2>&1 | tee -a $OUT/mtp_tests.log | grep -E "^test |cuda |drafter|err|panicked|result"
done
el "verify rows at Flash's shape (flash:4)"
DS4_TEST_DIR=/dev/shm timeout 200 $B/device-tests --nocapture --test-threads 1 --ignored verify_rows_flash4 2>&1 | tee $OUT/verify_flash4.log | grep -E "^test |model|panicked|result"
rm -f /dev/shm/ds4cuda-flash_4*
[ -n "$SP" ] && wait $SP; tail -2 /tmp/synth.log
if [ -n "$DT" ]; then wait $DT; grep -E "^test .*(FAILED|ok)$|test result|panicked" $OUT/device_tests.log | grep -v " ok$"; fi
if [ -f $B/old-mtp.xz ]; then
  # The previous build's mtp_step_costs first (same machine, same files): an A/B of the verify step.
  xz -dc $B/old-mtp.xz > /tmp/old-mtp && chmod +x /tmp/old-mtp
  el "step costs on CUDA, previous build"
  timeout 240 /tmp/old-mtp $M --mtp $MTP --backend cuda --ctx-at ${AT:-4096} --reps 7 --gen ${GEN:-128} 2>&1 | grep -v uploading | tee $OUT/mtp_costs_cuda_old.txt | grep -E "^plain decode|^[1-5] [|] [0-9.]+ [|] [0-9.]+ [|] [0-9.]+ [|] [0-9.]+$|^MTP draft|^end to end|(true|false)$"
fi
if [ -f $B/mid-mtp.xz ]; then
  # An intermediate build (e.g. one change of several), same measurement.
  xz -dc $B/mid-mtp.xz > /tmp/mid-mtp && chmod +x /tmp/mid-mtp
  el "step costs on CUDA, intermediate build"
  timeout 240 /tmp/mid-mtp $M --mtp $MTP --backend cuda --ctx-at ${AT:-4096} --reps 7 --gen ${GEN:-128} 2>&1 | grep -v uploading | tee $OUT/mtp_costs_cuda_mid.txt | grep -E "^plain decode|^[1-5] [|] [0-9.]+ [|] [0-9.]+ [|] [0-9.]+ [|] [0-9.]+$|^MTP draft|^end to end|(true|false)$"
fi
el "step costs on CUDA"
timeout 240 $B/mtp_step_costs $M --mtp $MTP --backend cuda --ctx-at ${AT:-4096} --reps 7 --gen ${GEN:-128} 2>&1 | grep -v uploading | tee $OUT/mtp_costs_cuda.txt | tail -35
if [ -n "${PROFILE:-}" ]; then
  # Per-kernel device times of each verify step size (kernel by kernel, no recorded replay).
  el "per-kernel profile"
  DS4_CUDA_PROFILE=1 timeout 120 $B/mtp_step_costs $M --backend cuda --ctx-at ${AT:-4096} --reps 3 > $OUT/mtp_profile.txt 2>&1
fi
if [ -n "${VULKAN:-}" ]; then
  . bench/wgpu/vulkan_env.sh
  el "step costs on Vulkan"
  timeout 200 $B/mtp_step_costs $M --mtp $MTP --backend vulkan --ctx-at ${AT:-4096} --reps 7 --gen ${GEN:-128} 2>&1 | grep -v uploading | tee $OUT/mtp_costs_vulkan.txt | tail -22
fi
if [ -n "${NCU:-}" ]; then
  # Per-kernel durations of decode and verify steps by row count (Nsight Compute, flash:4).
  el "ncu per-kernel durations"
  L=4 T=${NCU_T:-150} OUT=$OUT bash bench/cuda/ncu_verify.sh > $OUT/ncu.log 2>&1; rm -f $OUT/ncu_verify.csv; tail -32 $OUT/ncu.log
fi
el done
if [ -n "${PACK:-}" ]; then
  # One file back instead of many (a device call returns a limited number of files).
  (cd $OUT && tar -czf /tmp/mtp_results.tgz . && rm -rf ./* && mv /tmp/mtp_results.tgz results.tgz)
fi
