#!/usr/bin/env bash
# Same-run A/B of two ds4-bench binaries on full Flash q2 (synthetic, 43 layers) on the lent H200:
# runs A, B, A, B (interleaved so drift hits both) at ctx 512 and 4096 (prefill chunk 4096, 64 generated
# tokens) and prints one CSV row per run with the binary's label.
# Usage (repo root on the device, binaries carried in device-bin/):
#   A=device-bin/prev/ds4-bench B=device-bin/ds4-bench bench/cuda/stage_ab.sh
set -u
export DS4_WEIGHTS=mmap LD_LIBRARY_PATH=/usr/local/cuda/lib64 DS4_CUDA_INCLUDE=/usr/local/cuda/include DS4_CUDA_CACHE=/tmp/ds4cache
A=${A:-device-bin/prev/ds4-bench}
B=${B:-device-bin/ds4-bench}
OUT=${OUT:-/tmp/out}
M=${M:-/dev/shm/flash.gguf}
mkdir -p $OUT
cat README.md README.md README.md > /tmp/prompt.txt
[ -f $M ] || timeout 300 device-bin/ds4-gguf synth flash $M --mix q2 2>&1 | tail -1
echo "label,$(head -c 0 /dev/null)ctx,rest" > /dev/null
for round in ${ROUNDS:-1 2}; do
  for pair in "A:$A" "B:$B"; do
    label=${pair%%:*}; bin=${pair#*:}
    timeout 200 $bin -m $M --prompt-file /tmp/prompt.txt --ctx-start 512 --ctx-max 4096 --step-mul 8 \
      --gen-tokens ${GEN:-64} --prefill-chunk 4096 --backend cuda --mem-limit-gb 200 --csv $OUT/ab_${label}_$round.csv > $OUT/ab_${label}_$round.log 2>&1
    echo "rc=$? $label round $round ($bin)"
    sed "s/^/$label,$round,/" $OUT/ab_${label}_$round.csv
  done
done
