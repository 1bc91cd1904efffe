#!/usr/bin/env bash
# One device call after bench/prefill_ab_session.sh on a warm machine (flash:12 in /dev/shm): where a
# decode step goes, kernel by kernel, in this build (device-bin/ds4-bench) and the base build
# (device-bin/base-bench), through the CUDA graph (bench/cuda/ncu_decode.sh REAL=1), then the
# instruction-level stalls of $KERNELS (default hc_entry_dec) in this build (bench/cuda/ncu_source.sh).
# Results in $OUT/results.tgz. Prepare here: BASE=<commit> bench/build_ab_bins.sh.
. bench/device_prelude.sh
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $OUT/gpu.txt
mkdir -p /tmp/bb && ln -sf $PWD/$B/base-bench /tmp/bb/ds4-bench && ln -sf $PWD/$B/ds4-gguf /tmp/bb/ds4-gguf
for b in $B /tmp/bb; do
  t=$([ $b = $B ] && echo new || echo base)
  el "ncu decode $t"
  REAL=1 B=$b OUT=$OUT/ncu_decode_$t timeout 250 bash bench/cuda/ncu_decode.sh 12 2>&1 | head -40 > $OUT/ncu_decode_$t.txt
  head -30 $OUT/ncu_decode_$t.txt; pack
done
for k in ${KERNELS:-hc_entry_dec}; do
  el "ncu source $k"; KERNEL=$k OUT=$OUT timeout 200 bash bench/cuda/ncu_source.sh 12; pack
done
el done; pack
