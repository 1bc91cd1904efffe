#!/usr/bin/env bash
# Per-kernel GPU durations of decode steps and MTP verify steps of 2..5 tokens (Nsight Compute, the
# recorded steps' kernel nodes one by one, warm caches, free clocks), summed per step by kernel name:
# which kernels grow with a verify step's rows. Durations only: ncu serialises the kernels, so the
# overlap of side streams and programmatic dependent launch is not in these numbers.
# Usage on the device: L=4 bench/cuda/ncu_verify.sh   (writes $OUT/ncu_verify.csv and ncu_verify.txt)
set -u
export DS4_WEIGHTS=mmap LD_LIBRARY_PATH=/usr/local/cuda/lib64 DS4_CUDA_INCLUDE=/usr/local/cuda/include DS4_CUDA_CACHE=/tmp/ds4cache
B=${B:-device-bin}; OUT=${OUT:-/tmp/out}; L=${L:-4}; mkdir -p $OUT
M=/dev/shm/flash$L.gguf
[ -f $M ] || $B/ds4-gguf synth flash:$L $M --mix q2 2>&1 | tail -1
timeout ${T:-300} /usr/local/cuda/bin/ncu --metrics gpu__time_duration.sum --csv --graph-profiling node --cache-control none --clock-control none \
  $B/mtp_step_costs $M --backend cuda --ctx-at ${CTX:-512} --reps 1 > $OUT/ncu_verify.csv 2> $OUT/ncu_verify.err
echo "ncu rc=$?"; tail -2 $OUT/ncu_verify.err
python3 - "$OUT/ncu_verify.csv" <<'PY' | tee $OUT/ncu_verify.txt
import csv, sys, collections, re
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
hdr = rows[0]; ki = hdr.index("Kernel Name"); vi = hdr.index("Metric Value"); ui = hdr.index("Metric Unit"); gi = hdr.index("Grid Size")
seq = []
for r in rows[1:]:
    v = float(r[vi].replace(",", "")); u = r[ui]
    v = v / 1000.0 if u in ("ns", "nsecond") else (v if u in ("us", "usecond") else v * 1000.0)
    g = [int(x) for x in re.findall(r"\d+", r[gi])] or [1, 1, 1]
    seq.append((r[ki].split("(")[0], g, v))
# Steps start at `embed`; a step's size is the grid z of its decode attention (prefill has none).
steps, cur = [], None
for k in seq:
    if k[0] == "embed":
        cur = []; steps.append(cur)
    if cur is not None:
        cur.append(k)
kinds = collections.defaultdict(list)
for s in steps:
    z = [g[2] for n, g, _ in s if n == "attn_dec"]
    if z:
        kinds[z[0]].append(s)
sizes = sorted(kinds)
per = {}
for z in sizes:
    acc = collections.defaultdict(float)
    for s in kinds[z]:
        for n, _, v in s:
            acc[n] += v / len(kinds[z])
    per[z] = acc
names = sorted(set().union(*[per[z].keys() for z in sizes]), key=lambda n: -per[sizes[-1]].get(n, 0))
print("us per step by kernel (steps of each size: " + ", ".join(f"{z}: {len(kinds[z])}" for z in sizes) + ")")
print(f"{'kernel':<22}" + "".join(f"{'rows ' + str(z):>11}" for z in sizes))
for n in names:
    print(f"{n:<22}" + "".join(f"{per[z].get(n, 0):11.1f}" for z in sizes))
print(f"{'total':<22}" + "".join(f"{sum(per[z].values()):11.1f}" for z in sizes))
print(f"{'launches':<22}" + "".join(f"{len(kinds[z][0]):11d}" for z in sizes))
PY
