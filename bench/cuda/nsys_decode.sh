#!/usr/bin/env bash
# Decode kernels as they run in the CUDA graph (Nsight Systems, graph nodes traced): per-kernel time,
# per-token wall time and the time no kernel runs, for the last decode steps of a flash:L q2 model.
# Usage on the device: bench/cuda/nsys_decode.sh [layers]   (writes $OUT/nsys_decode.txt)
set -u
export DS4_WEIGHTS=mmap LD_LIBRARY_PATH=/usr/local/cuda/lib64 DS4_CUDA_INCLUDE=/usr/local/cuda/include DS4_CUDA_CACHE=/tmp/ds4cache
B=${B:-device-bin}; OUT=${OUT:-/tmp/out}; L=${1:-6}; CTX=${CTX:-4096}; mkdir -p $OUT
NSYS=$(command -v nsys || ls /usr/local/cuda/bin/nsys /opt/nvidia/nsight-systems/*/bin/nsys /usr/local/cuda/nsight-systems*/bin/nsys 2>/dev/null | head -1)
[ -n "$NSYS" ] || { echo "no nsys on this machine"; exit 0; }
[ -f /dev/shm/flash$L.gguf ] || $B/ds4-gguf synth flash:$L /dev/shm/flash$L.gguf --mix q2 2>&1 | tail -1
cat README.md README.md README.md > /tmp/prompt.txt
rm -f /tmp/nsys_dec.*
timeout 300 $NSYS profile --trace=cuda --cuda-graph-trace=node --sample=none --cpuctxsw=none -o /tmp/nsys_dec \
  $B/ds4-bench -m /dev/shm/flash$L.gguf --prompt-file /tmp/prompt.txt --ctx-start $CTX --ctx-max $CTX --gen-tokens ${GEN:-12} \
  --prefill-chunk 4096 --backend cuda --mem-limit-gb 200 > $OUT/nsys_run.log 2>&1
echo "nsys rc=$?"
timeout 200 $NSYS stats --report cuda_gpu_trace --format csv --output /tmp/nsys_dec /tmp/nsys_dec.nsys-rep > /dev/null 2>&1
ls /tmp/nsys_dec*
python3 - /tmp/nsys_dec_cuda_gpu_trace.csv "$L" > $OUT/nsys_decode.txt <<'PY'
import csv, sys, collections
rows = list(csv.DictReader(open(sys.argv[1])))
k = [r for r in rows if r.get("GrdX") not in (None, "")]
ks = lambda r: float(r["Start (ns)"]); kd = lambda r: float(r["Duration (ns)"])
k.sort(key=ks)
# A decode step starts at an `embed` kernel; take the last 4 complete steps (the final one may end in argmax).
starts = [i for i, r in enumerate(k) if r["Name"].startswith("embed")]
segs = [(starts[j], starts[j + 1]) for j in range(len(starts) - 1)][-4:]
print(f"{len(k)} kernels traced; {len(starts)} forward passes; decode steps analysed: {len(segs)} (flash:{sys.argv[2]})")
tot = collections.defaultdict(float); cnt = collections.Counter(); walls = []; idle = []
for a, b in segs:
    seg = k[a:b]
    t0 = ks(seg[0]); t1 = max(ks(r) + kd(r) for r in seg)
    walls.append(t1 - t0)
    # time covered by at least one kernel
    cov = 0.0; cur_s = cur_e = None
    for r in seg:
        s, e = ks(r), ks(r) + kd(r)
        if cur_e is None or s > cur_e:
            if cur_e is not None: cov += cur_e - cur_s
            cur_s, cur_e = s, e
        else: cur_e = max(cur_e, e)
    cov += cur_e - cur_s
    idle.append(t1 - t0 - cov)
    for r in seg:
        n = r["Name"].split("(")[0]; tot[n] += kd(r); cnt[n] += 1
ns = len(segs)
print(f"per step: wall {sum(walls)/ns/1000:.1f} us, no kernel running {sum(idle)/ns/1000:.1f} us, kernels {sum(cnt.values())/ns:.0f}")
s = sum(tot.values())
for n, v in sorted(tot.items(), key=lambda x: -x[1]):
    print(f"  {n:<20} {v/ns/1000:8.1f} us/step {100*v/s:5.1f}%  {cnt[n]/ns:6.1f} calls/step  {v/cnt[n]/1000:7.2f} us/call")
# One step launch by launch: start offset, duration, gap since the previous kernel ended (critical-path view).
a, b = segs[-1]
t0 = ks(k[a]); prev_end = t0
print("\nlast step, kernel by kernel: start_us dur_us gap_us stream name")
for r in k[a:b]:
    s = ks(r); print(f"  {(s-t0)/1000:8.1f} {kd(r)/1000:6.1f} {(s-prev_end)/1000:6.1f} {r.get('Strm','?'):>4} {r['Name'].split('(')[0]}")
    prev_end = max(prev_end, s + kd(r))
PY
head -60 $OUT/nsys_decode.txt
