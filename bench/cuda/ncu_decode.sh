#!/usr/bin/env bash
# Per-kernel GPU durations of decode steps (Nsight Compute, one metric), summed by kernel name.
# Usage on the device: bench/cuda/ncu_decode.sh [layers]   (writes $OUT/ncu_decode.csv and a summary)
set -u
export DS4_WEIGHTS=mmap LD_LIBRARY_PATH=/usr/local/cuda/lib64 DS4_CUDA_INCLUDE=/usr/local/cuda/include DS4_CUDA_CACHE=/tmp/ds4cache
B=${B:-device-bin}; OUT=${OUT:-/tmp/out}; L=${1:-6}; mkdir -p $OUT
[ -f /dev/shm/flash$L.gguf ] || $B/ds4-gguf synth flash:$L /dev/shm/flash$L.gguf --mix q2 2>&1 | tail -1
cat README.md README.md README.md > /tmp/prompt.txt
# Default: a 64-token prefill, then decode launch by launch (DS4_CUDA_PROFILE=1 keeps the steps out of
# CUDA graphs), caches flushed and clocks locked per kernel; skip the load and prefill launches. REAL=1: decode through the CUDA graph
# (kernel nodes profiled one by one) after a CTX-token prefill, warm caches and free clocks.
if [ "${REAL:-0}" = 1 ]; then
  CTX=${CTX:-4096}
  timeout 400 /usr/local/cuda/bin/ncu --metrics gpu__time_duration.sum --csv --graph-profiling node --cache-control none --clock-control none \
    --launch-skip ${SKIP:-1200} --launch-count ${COUNT:-700} \
    $B/ds4-bench -m /dev/shm/flash$L.gguf --prompt-file /tmp/prompt.txt --ctx-start $CTX --ctx-max $CTX --gen-tokens 16 \
    --prefill-chunk 4096 --backend cuda --mem-limit-gb 200 > $OUT/ncu_decode.csv 2> $OUT/ncu_decode.err
else
  DS4_CUDA_PROFILE=1 timeout 400 /usr/local/cuda/bin/ncu --metrics gpu__time_duration.sum --csv \
    --launch-skip ${SKIP:-3000} --launch-count ${COUNT:-900} \
    $B/ds4-bench -m /dev/shm/flash$L.gguf --prompt-file /tmp/prompt.txt --ctx-start 64 --ctx-max 64 --gen-tokens 16 \
    --prefill-chunk 64 --backend cuda --mem-limit-gb 200 > $OUT/ncu_decode.csv 2> $OUT/ncu_decode.err
fi
echo "ncu rc=$?"; tail -3 $OUT/ncu_decode.err
python3 - "$OUT/ncu_decode.csv" <<'PY'
import csv, sys, collections
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
hdr = rows[0]; ki = hdr.index("Kernel Name"); vi = hdr.index("Metric Value"); ui = hdr.index("Metric Unit")
tot = collections.defaultdict(float); cnt = collections.Counter(); seq = []
for r in rows[1:]:
    v = float(r[vi].replace(",", "")); u = r[ui]
    v = v / 1000.0 if u in ("ns", "nsecond") else (v if u in ("us", "usecond") else v * 1000.0)
    n = r[ki].split("(")[0]; tot[n] += v; cnt[n] += 1; seq.append((n, v))
s = sum(tot.values())
print(f"{len(rows)-1} kernels, {s:.0f} us total GPU time")
for n, v in sorted(tot.items(), key=lambda x: -x[1]):
    print(f"  {n:<20} {v:9.1f} us {100*v/s:5.1f}%  {cnt[n]:5d} calls  {v/cnt[n]:7.2f} us/call")
PY

# The kernels of one whole decode step (from one `embed` to the next), in launch order.
python3 - "$OUT/ncu_decode.csv" <<'PY' > $OUT/ncu_step.txt
import csv, sys
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
hdr = rows[0]; ki = hdr.index("Kernel Name"); vi = hdr.index("Metric Value"); ui = hdr.index("Metric Unit")
seq = []
for r in rows[1:]:
    v = float(r[vi].replace(",", "")); u = r[ui]
    v = v / 1000.0 if u in ("ns", "nsecond") else (v if u in ("us", "usecond") else v * 1000.0)
    seq.append((r[ki].split("(")[0], v))
st = [i for i, (n, _) in enumerate(seq) if n == "embed"]
if len(st) >= 2:
    a, b = st[-2], st[-1]
    print(f"one decode step: {b-a} kernels, {sum(v for _, v in seq[a:b]):.1f} us summed")
    for n, v in seq[a:b]: print(f"  {v:7.2f}  {n}")
PY
head -3 $OUT/ncu_step.txt
