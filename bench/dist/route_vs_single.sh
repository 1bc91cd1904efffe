#!/usr/bin/env bash
# A 2-stage route (coordinator = ds4-bench --role coordinator with layers 0:SPLIT, worker = a separate
# `ds4 --role worker` process with SPLIT+1:output, loopback TCP) against the single process on the same
# model and backend: decode and prefill tokens/s (CSV), greedy token ids of both (compared here), the
# per-hop telemetry (coordinator log, --debug), and the pipelined prefill (chunk PCHUNK, window 1 vs
# the default window).
# Usage (repo root): M=model.gguf SPLIT=K [BACKEND=cpu|cuda] [B=bin dir] [OUT=dir] bench/dist/route_vs_single.sh [bits...]
# e.g. on the GPU host: B=device-bin M=/dev/shm/flash.gguf SPLIT=21 BACKEND=cuda bench/dist/route_vs_single.sh 32 16 8
set -u
B=${B:-target/release}
M=${M:?set M to the model file}
SPLIT=${SPLIT:?set SPLIT: the coordinator takes layers 0:SPLIT}
BACKEND=${BACKEND:-cpu}
OUT=${OUT:-/tmp/route_vs_single}
F=${F:-4096}          # context frontier (prompt tokens)
GEN=${GEN:-64}        # decoded tokens
CHUNK=${CHUNK:-4096}  # prefill chunk (single process, and the route's first runs)
PCHUNK=${PCHUNK:-1024} # chunk of the pipelined-prefill comparison
PORT=${PORT:-9471}
MEM=${MEM:-200}
PROMPT=${PROMPT:-/tmp/route_prompt.txt}
mkdir -p "$OUT"
[ -f "$PROMPT" ] || cat README.md README.md README.md > "$PROMPT"
T0=$(date +%s)
el() { echo "[+$(( $(date +%s) - T0 ))s] $*"; }
COMMON="-m $M --prompt-file $PROMPT --ctx-start $F --ctx-max $F --gen-tokens $GEN --backend $BACKEND --mem-limit-gb $MEM --debug"
el "single process"
timeout ${ST:-240} $B/ds4-bench $COMMON --prefill-chunk $CHUNK --csv $OUT/single.csv 2> $OUT/single.log
echo "single rc=$?"; cat $OUT/single.csv
# One worker serves every coordinator run below (it reconnects when a coordinator goes away).
$B/ds4 -m $M --role worker --layers $((SPLIT + 1)):output --coordinator 127.0.0.1 $PORT --backend $BACKEND \
  -c $((F + GEN + 64)) --prefill-chunk $CHUNK --mem-limit-gb $MEM > $OUT/worker.log 2>&1 &
W=$!
route() { # name, extra coordinator flags
  el "route $1"
  timeout ${RT:-240} $B/ds4-bench $COMMON --role coordinator --layers 0:$SPLIT --listen 127.0.0.1 $PORT "${@:2}" \
    --csv $OUT/route_$1.csv 2> $OUT/route_$1.log
  echo "route $1 rc=$?"; cat $OUT/route_$1.csv
}
for bits in ${@:-32 16 8}; do
  route bits$bits --dist-activation-bits $bits --prefill-chunk $CHUNK
done
route pchunk${PCHUNK}_window1 --dist-prefill-chunk $PCHUNK --dist-prefill-window 1
route pchunk${PCHUNK}_pipelined --dist-prefill-chunk $PCHUNK
kill $W; wait $W 2>/dev/null
el "summary"
{
  echo "single: $(tail -1 $OUT/single.csv)"
  for f in $OUT/route_*.csv; do echo "$(basename $f .csv): $(tail -1 $f)"; done
  s=$(grep -h "greedy token ids" $OUT/single.log | tail -1 | sed 's/.*ids //')
  for f in $OUT/route_*.log; do
    r=$(grep -h "greedy token ids" $f | tail -1 | sed 's/.*ids //')
    if [ -n "$r" ] && [ "$r" = "$s" ]; then echo "$(basename $f .log): greedy tokens identical to the single process"; else echo "$(basename $f .log): greedy tokens DIFFER (single $s / route $r)"; fi
  done
  python3 - "$OUT" <<'EOF'
import csv, glob, os, sys
out = sys.argv[1]
row = lambda p: next(csv.DictReader(open(p)))
s = row(f"{out}/single.csv")
for p in sorted(glob.glob(f"{out}/route_*.csv")):
    r = row(p)
    print(f"{os.path.basename(p)[:-4]}: decode ratio route/single {float(r['gen_tps']) / float(s['gen_tps']):.3f}, prefill ratio {float(r['prefill_tps']) / float(s['prefill_tps']):.3f}")
w1 = [p for p in glob.glob(f"{out}/route_pchunk*_window1.csv")]
pp = [p for p in glob.glob(f"{out}/route_pchunk*_pipelined.csv")]
if w1 and pp:
    print(f"pipelined prefill speedup (window default / window 1): {float(row(pp[0])['prefill_tps']) / float(row(w1[0])['prefill_tps']):.3f}")
EOF
} | tee $OUT/summary.txt
