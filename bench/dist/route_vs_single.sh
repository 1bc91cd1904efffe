#!/usr/bin/env bash
# A 2-stage route (coordinator = ds4-bench --role coordinator with layers 0:SPLIT, worker = a separate
# `ds4 --role worker` process with SPLIT+1:output, loopback TCP) against the single process on the same
# model and backend: decode and prefill tokens/s (CSV), greedy token ids of both (compared here), the
# per-hop telemetry (coordinator log, --debug), and the pipelined prefill (chunk PCHUNK, window 1 vs
# the default window).
# Usage (repo root): M=model.gguf SPLIT=K [BACKEND=cpu|cuda] [B=bin dir] [OUT=dir] bench/dist/route_vs_single.sh [bits...]
# e.g. on the GPU host: B=device-bin M=/dev/shm/flash.gguf SPLIT=21 BACKEND=cuda SPIN=5000 bench/dist/route_vs_single.sh 32 16 8
# Bits arguments: 32|16|8 set --dist-activation-bits (decode and prefill); pN sets only the prefill's
# format (--dist-prefill-bits N, decode at 32 bits). Each route run also appends a row to CSV (default
# bench/results/dist/route_gpu.csv): stages,bits,prompt_tokens,single_prefill_tps,route_prefill_tps,
# single_decode_tps,route_decode_tps,tokens_identical (RUN=label goes into OUT's name only).
# (WFLAGS: extra worker flags, e.g. --debug for each request's eval time; SPIN=N: a last run with both sides busy-polling up to N us per hop, --dist-spin-us; SPLIT2=L: two
# workers, SPLIT+1:L and L+1:output, a 3-stage route; PCHUNK_RUNS=0 skips the prefill-chunk runs)
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
single() { # name, prefill chunk
  el "single process, prefill chunk $2"
  timeout ${ST:-240} $B/ds4-bench $COMMON --prefill-chunk $2 --csv $OUT/$1.csv 2> $OUT/$1.log
  echo "$1 rc=$?"; cat $OUT/$1.csv
}
single single $CHUNK
[ -n "${PCHUNK_RUNS:-1}" ] && [ "${PCHUNK_RUNS:-1}" != 0 ] && single single_pchunk $PCHUNK
# With SPLIT2 set, two workers: SPLIT+1:SPLIT2 and SPLIT2+1:output (a 3-stage route).
worker() { # log name, extra worker flags
  if [ -n "${SPLIT2:-}" ]; then
    $B/ds4 -m $M --role worker --layers $((SPLIT + 1)):$SPLIT2 --coordinator 127.0.0.1 $PORT --backend $BACKEND \
      -c $((F + GEN + 64)) --prefill-chunk $CHUNK --mem-limit-gb $MEM ${WFLAGS:-} "${@:2}" > $OUT/$1_a.log 2>&1 &
    W2=$!
  fi
  $B/ds4 -m $M --role worker --layers $((${SPLIT2:-$SPLIT} + 1)):output --coordinator 127.0.0.1 $PORT --backend $BACKEND \
    -c $((F + GEN + 64)) --prefill-chunk $CHUNK --mem-limit-gb $MEM ${WFLAGS:-} "${@:2}" > $OUT/$1.log 2>&1 &
  W="$! ${W2:-}"
}
# The workers serve every coordinator run below (they reconnect when a coordinator goes away).
worker worker
route() { # name, extra coordinator flags
  el "route $1"
  timeout ${RT:-240} $B/ds4-bench $COMMON --role coordinator --layers 0:$SPLIT --listen 127.0.0.1 $PORT "${@:2}" \
    --csv $OUT/route_$1.csv 2> $OUT/route_$1.log
  echo "route $1 rc=$?"; cat $OUT/route_$1.csv
}
for bits in ${@:-32 16 8}; do
  case $bits in
    p*) route bits$bits --dist-prefill-bits ${bits#p} --prefill-chunk $CHUNK ;;
    *) route bits$bits --dist-activation-bits $bits --prefill-chunk $CHUNK ;;
  esac
done
if [ "${PCHUNK_RUNS:-1}" != 0 ]; then
  route pchunk${PCHUNK}_window1 --dist-prefill-chunk $PCHUNK --dist-prefill-window 1
  route pchunk${PCHUNK}_pipelined --dist-prefill-chunk $PCHUNK
fi
kill $W; wait $W 2>/dev/null
if [ -n "${SPIN:-}" ]; then
  # Both sides busy-poll up to SPIN us for the next frame before blocking (0: block at once).
  worker worker_spin --dist-spin-us $SPIN
  route bits32_spin$SPIN --dist-activation-bits 32 --prefill-chunk $CHUNK --dist-spin-us $SPIN
  kill $W; wait $W 2>/dev/null
fi
el "summary"
{
  for f in $OUT/single*.csv $OUT/route_*.csv; do echo "$(basename $f .csv): $(tail -1 $f)"; done
  # Each route against the single process with the same prefill chunk.
  for f in $OUT/route_*.log; do
    case $f in *pchunk*) ref=$OUT/single_pchunk.log ;; *) ref=$OUT/single.log ;; esac
    s=$(grep -h "greedy token ids" $ref | tail -1 | sed 's/.*ids //')
    r=$(grep -h "greedy token ids" $f | tail -1 | sed 's/.*ids //')
    if [ -n "$r" ] && [ "$r" = "$s" ]; then echo "$(basename $f .log): greedy tokens identical to $(basename $ref .log)"; else echo "$(basename $f .log): greedy tokens DIFFER from $(basename $ref .log) ($s / $r)"; fi
  done
  python3 - "$OUT" <<'EOF'
import csv, glob, os, sys
out = sys.argv[1]
row = lambda p: next(csv.DictReader(open(p)))
s = row(f"{out}/single.csv")
sp = row(f"{out}/single_pchunk.csv") if os.path.exists(f"{out}/single_pchunk.csv") else None
for p in sorted(glob.glob(f"{out}/route_*.csv")):
    r = row(p)
    if "pchunk" in p and sp:
        print(f"{os.path.basename(p)[:-4]}: prefill ratio to the single process at the same chunk {float(r['prefill_tps']) / float(sp['prefill_tps']):.3f}")
    print(f"{os.path.basename(p)[:-4]}: decode ratio route/single {float(r['gen_tps']) / float(s['gen_tps']):.3f}, prefill ratio {float(r['prefill_tps']) / float(s['prefill_tps']):.3f}")
# The acceptance CSV: one row per route run at the default prefill chunk.
import re
def ids(p):
    m = [l for l in open(p, errors="replace") if "greedy token ids" in l]
    return m[-1].split("ids", 1)[1].strip() if m else None
acc = os.environ.get("CSV") or "bench/results/dist/route_gpu.csv"
stages = 3 if os.environ.get("SPLIT2") else 2
new = not os.path.exists(acc)
with open(acc, "a") as f:
    if new:
        f.write("stages,bits,prompt_tokens,single_prefill_tps,route_prefill_tps,single_decode_tps,route_decode_tps,tokens_identical\n")
    for p in sorted(glob.glob(f"{out}/route_bits*.csv")):
        name = os.path.basename(p)[:-4]
        m = re.fullmatch(r"route_bits(p?\d+)", name)
        if not m:
            continue
        r = row(p)
        same = ids(p[:-4] + ".log")
        same = same is not None and same == ids(f"{out}/single.log")
        f.write(f"{stages},{m.group(1)},{r['prefill_tokens']},{s['prefill_tps']},{r['prefill_tps']},{s['gen_tps']},{r['gen_tps']},{str(same).lower()}\n")
print(f"rows appended to {acc}")
w1 = [p for p in glob.glob(f"{out}/route_pchunk*_window1.csv")]
pp = [p for p in glob.glob(f"{out}/route_pchunk*_pipelined.csv")]
if w1 and pp:
    print(f"pipelined prefill speedup (window default / window 1): {float(row(pp[0])['prefill_tps']) / float(row(w1[0])['prefill_tps']):.3f}")
EOF
} | tee $OUT/summary.txt
