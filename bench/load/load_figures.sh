#!/usr/bin/env bash
# Load figures of bench/results/load.md: refusals before loading, and loads in each weight mode.
# Usage: bench/load/load_figures.sh MODEL.gguf [BUDGET_GB]   (needs GNU time in /usr/bin/time)
# Make the model with: target/release/ds4-gguf synth flash:1 /tmp/flash1.gguf --mix q2
set -u
M=$1
LIMIT=${2:-1}
DS4=${DS4:-target/release/ds4}
t() { echo "\$ ds4 $(echo "$*" | cut -c1-90)"; /usr/bin/time -f "  -> %e s wall, peak RSS %M KiB, exit %x" "$DS4" "$@" 2>&1 >/dev/null | grep -E "^  ->|^memory:|^ds4:|weights"; }
long=$(printf 'the quick brown fox jumps over the lazy dog %.0s' $(seq 1 400))
t -m "$M" --mem-limit-gb "$LIMIT" -p Hi
t -m "$M" --ctx 256 -p "$long"
t -m "$M" -p Hi -n 8 --temp 0
t -m "$M" -p Hi -n 8 --temp 0
t -m "$M" -p Hi -n 8 --temp 0 --weights mmap
t -m "$M" -p Hi -n 8 --temp 0 --weights mmap --warm-weights
