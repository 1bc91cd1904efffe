#!/usr/bin/env bash
# Prefill on CUDA by chunk size (results under $OUT): ds4-bench at each chunk of $CHUNKS (one chunk of
# that many tokens, 8 generated) -> prefill_<chunk>.csv; with device-bin/old-bench.xz (a previous
# build's ds4-bench) that build first at each chunk, same file, same call -> prefill_old_<chunk>.csv
# (an A/B); with mid-bench.xz an intermediate build's next -> prefill_mid_<chunk>.csv. PROFILE=1 adds DS4_CUDA_PROFILE=1 (CUDA events per kernel, so launches run one at a time:
# the shares count, not the totals) at 512 and 4096 -> prefill_profile_<chunk>.txt (and the
# intermediate build's at 4096 -> prefill_profile_mid_4096.txt).
# Run on the device after bench/cuda/build_device_bin.sh: M=/dev/shm/flash30.gguf bench/cuda/prefill_profile.sh
set -u
OUT=${OUT:-/tmp/out}; B=${B:-device-bin}; M=${M:-/dev/shm/flash30.gguf}
mkdir -p $OUT
export DS4_WEIGHTS=mmap LD_LIBRARY_PATH=/usr/local/cuda/lib64 DS4_CUDA_INCLUDE=/usr/local/cuda/include DS4_CUDA_CACHE=${DS4_CUDA_CACHE:-/tmp/ds4cache}
cat README.md README.md README.md > /tmp/prompt.txt
unpack() { [ -f $B/$1.xz ] && xz -dc $B/$1.xz > /tmp/$1 && chmod +x /tmp/$1 && echo /tmp/$1; }
OLD=$(unpack old-bench); MID=$(unpack mid-bench)
bench() { timeout 200 $1 -m $M --prompt-file /tmp/prompt.txt --ctx-start $2 --ctx-max $2 --gen-tokens 8 --prefill-chunk $2 --backend cuda --csv $3 > ${3%.csv}.log 2>&1; echo "$(basename $1) chunk $2: $(tail -1 $3)"; }
for c in ${CHUNKS:-512 1024 2048 4096}; do
  [ -n "$OLD" ] && bench $OLD $c $OUT/prefill_old_$c.csv
  [ -n "$MID" ] && bench $MID $c $OUT/prefill_mid_$c.csv
  bench $B/ds4-bench $c $OUT/prefill_$c.csv
done
prof() { # binary, chunk, file
  DS4_CUDA_PROFILE=1 timeout 200 $1 -m $M --prompt-file /tmp/prompt.txt --ctx-start $2 --ctx-max $2 --gen-tokens 4 \
    --prefill-chunk $2 --backend cuda 2>&1 | grep -v uploading > $3
  echo "$(basename $1) chunk $2:"; grep -A14 "prefill:" $3 | head -16
}
if [ -n "${PROFILE:-}" ]; then
  for c in 512 4096; do prof $B/ds4-bench $c $OUT/prefill_profile_$c.txt; done
  [ -n "$MID" ] && prof $MID 4096 $OUT/prefill_profile_mid_4096.txt
fi
