#!/usr/bin/env bash
# Same-run A/B of two ds4-bench builds on the CPU backend (interleaved rounds), and the in-cache
# kernel rows of two kernel_micro builds. Usage:
#   bench/cpu/ab_cpu.sh BASE_TARGET_DIR NEW_TARGET_DIR MODEL PROMPT_FILE [ROUNDS]
# e.g. a base worktree built with --target-dir /tmp/ds4-ab-target and this tree's target/:
#   (cd /tmp/base && cargo build --release -p ds4-cli --bin ds4-bench -p ds4-quant --example kernel_micro --target-dir /tmp/ds4-ab-target)
#   cargo build --release -p ds4-cli --bin ds4-bench -p ds4-quant --example kernel_micro
#   ds4-gguf synth flash:1 /tmp/flash1.gguf --mix q2
#   bench/cpu/ab_cpu.sh /tmp/ds4-ab-target target /tmp/flash1.gguf prompt.txt 3
set -euo pipefail
BASE=$1; NEW=$2; MODEL=$3; PROMPT=$4; ROUNDS=${5:-3}
for d in "$BASE" "$NEW"; do
  echo "kernel_micro $d: $("$d/release/examples/kernel_micro" --reps 40 | grep -v Scalar | tr '\n' ' ')"
done
echo "build,ctx_tokens,prefill_tokens,prefill_tps,gen_tokens,gen_tps,kvcache_bytes"
for r in $(seq "$ROUNDS"); do
  for d in "$BASE" "$NEW"; do
    line=$("$d/release/ds4-bench" -m "$MODEL" --prompt-file "$PROMPT" --ctx-start 1024 --ctx-max 1024 -n 16 --prefill-chunk 256 2>/dev/null | grep -E '^1024,')
    echo "$d,$line"
  done
done
