#!/usr/bin/env bash
# Issue 29's acceptance runs: RUNS (default 3) rounds of a 2-stage (0:SPLIT | SPLIT+1:output) and a
# 3-stage (0:S3A | S3A+1:S3B | S3B+1:output) route against the single process, each at 32 bits and
# with 16-bit prefill (decode at 32 bits), default prefill chunking (micro-chunk picked from measured
# costs, at most --prefill-chunk CHUNK), rows appended to bench/results/dist/route_gpu.csv
# (header: stages,bits,prompt_tokens,single_prefill_tps,route_prefill_tps,single_decode_tps,route_decode_tps,tokens_identical).
# Usage on the GPU host (repo root; binaries from bench/cuda/build_device_bin.sh, model from
# `ds4-gguf synth flash /dev/shm/flash.gguf --mix q2`):
#   B=device-bin M=/dev/shm/flash.gguf bench/dist/route_gpu_acceptance.sh
# Logs per run in OUT_BASE/run<N>_<stages>stage/ (default /tmp/route_gpu).
set -u
RUNS=${RUNS:-3}
SPLIT=${SPLIT:-21}
S3A=${S3A:-14}
S3B=${S3B:-28}
BITS=${BITS:-32 p16}
OUT_BASE=${OUT_BASE:-/tmp/route_gpu}
export CSV=${CSV:-bench/results/dist/route_gpu.csv}
export BACKEND=${BACKEND:-cuda} GEN=${GEN:-256} F=${F:-4096} CHUNK=${CHUNK:-4096} PCHUNK_RUNS=0
HERE=$(dirname "$0")
for run in $(seq 1 "$RUNS"); do
  OUT=$OUT_BASE/run${run}_2stage SPLIT=$SPLIT SPLIT2= "$HERE/route_vs_single.sh" $BITS
  OUT=$OUT_BASE/run${run}_3stage SPLIT=$S3A SPLIT2=$S3B "$HERE/route_vs_single.sh" $BITS
done
python3 - "$CSV" <<'PY'
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
for r in rows:
    p = float(r["route_prefill_tps"]) / float(r["single_prefill_tps"])
    d = float(r["route_decode_tps"]) / float(r["single_decode_tps"])
    need = (0.9, 0.95) if r["stages"] == "2" else (0.8, 0.92)
    ok = p >= need[0] and d >= need[1] and (r["bits"] != "32" or r["tokens_identical"] == "true")
    print(f"{r['stages']} stages, bits {r['bits']}: prefill {p:.3f} decode {d:.3f} tokens_identical {r['tokens_identical']} -> {'meets' if ok else 'MISSES'} {need}")
PY
