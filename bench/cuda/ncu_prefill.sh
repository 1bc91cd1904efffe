#!/usr/bin/env bash
# Per-kernel GPU durations of one prefill chunk (Nsight Compute, one metric; kernels serialized, so
# side-stream overlap is lost but every duration is the kernel's own, unlike DS4_CUDA_PROFILE's events),
# summed by kernel name, for each chunk size in $CHUNKS (default "512 4096").
# Usage on the device: M=/dev/shm/flash12.gguf [BIN=device-bin/ds4-bench] bench/cuda/ncu_prefill.sh
# (writes $OUT/ncu_prefill_<chunk>.csv and .txt)
set -u
export DS4_WEIGHTS=mmap LD_LIBRARY_PATH=/usr/local/cuda/lib64 DS4_CUDA_INCLUDE=/usr/local/cuda/include DS4_CUDA_CACHE=${DS4_CUDA_CACHE:-/tmp/ds4cache}
OUT=${OUT:-/tmp/out}; BIN=${BIN:-device-bin/ds4-bench}; mkdir -p $OUT
cat README.md README.md README.md > /tmp/prompt.txt
for c in ${CHUNKS:-512 4096}; do
  DS4_CUDA_PROFILE=1 timeout ${NCU_TIMEOUT:-200} /usr/local/cuda/bin/ncu --metrics gpu__time_duration.sum --csv \
    $BIN -m $M --prompt-file /tmp/prompt.txt --ctx-start $c --ctx-max $c --gen-tokens 1 \
    --prefill-chunk $c --backend cuda --mem-limit-gb 200 > $OUT/ncu_prefill_$c.csv 2> $OUT/ncu_prefill_$c.err
  echo "chunk $c: ncu rc=$?"
  python3 - "$OUT/ncu_prefill_$c.csv" > $OUT/ncu_prefill_$c.txt <<'PY'
import csv, sys, collections
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
hdr = rows[0]; ki = hdr.index("Kernel Name"); vi = hdr.index("Metric Value"); ui = hdr.index("Metric Unit")
tot = collections.defaultdict(float); cnt = collections.Counter()
load = ("split_rows", "comp_reset")
for r in rows[1:]:
    v = float(r[vi].replace(",", "")); u = r[ui]
    v = v / 1000.0 if u in ("ns", "nsecond") else (v if u in ("us", "usecond") else v * 1000.0)
    n = r[ki].split("(")[0][:60]
    if n.startswith(load): continue
    tot[n] += v; cnt[n] += 1
s = sum(tot.values())
print(f"{sum(cnt.values())} kernels after loading, {s:.0f} us total GPU time (prefill and 1 decode step)")
for n, v in sorted(tot.items(), key=lambda x: -x[1]):
    print(f"  {n:<60} {v:9.1f} us {100*v/s:5.1f}%  {cnt[n]:5d} calls  {v/cnt[n]:8.2f} us/call")
PY
  head -30 $OUT/ncu_prefill_$c.txt
done
