#!/usr/bin/env bash
# Full-depth CPU vs CUDA on a non-chaotic Flash-shaped model (issue 25): `ds4-gguf synth flash --gain G`
# scales the residual branches' output projections so a perturbation does not grow through the 43 layers.
# Both backends decode 64 greedy tokens with --dump-logprobs; compare_logprobs.py compares the token ids and
# the top log-probabilities step by step. Run on the lent GPU with the binaries of build_device_bin.sh:
#   B=device-bin OUT=/tmp/out GAIN=0.1 bench/cuda/gain_cpu_vs_cuda.sh
set -u
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 DS4_CUDA_INCLUDE=/usr/local/cuda/include DS4_CUDA_CACHE=/tmp/ds4cache
B=${B:-device-bin}
OUT=${OUT:-/tmp/out}
GAIN=${GAIN:-0.1}
M=/dev/shm/flash_gain.gguf
mkdir -p $OUT
T0=$(date +%s)
el() { echo "[+$(( $(date +%s) - T0 ))s] $*"; }
el "synth flash q2 --gain $GAIN"
[ -f $M ] || timeout 300 $B/ds4-gguf synth flash $M --mix q2 --gain $GAIN 2>&1 | tail -1
P="Explain in one paragraph why the sky is blue, and what changes at sunset."
for q in "" "--quality"; do
  tag=${q:-fast}; tag=${tag#--}
  el "cuda $tag"
  timeout 200 $B/ds4 -m $M --cuda $q --ctx 4096 --temp 0 -n 64 --nothink -p "$P" --dump-logprobs $OUT/cuda_$tag.json --logprobs-top-k 5 > $OUT/cuda_$tag.log 2>&1; echo "rc=$?"
  el "cpu $tag"
  timeout 400 $B/ds4 -m $M --cpu --weights mmap --mem-limit-gb 200 --ctx 4096 --temp 0 -n 64 --nothink -p "$P" --dump-logprobs $OUT/cpu_$tag.json --logprobs-top-k 5 > $OUT/cpu_$tag.log 2>&1; echo "rc=$?"
  python3 bench/cuda/compare_logprobs.py $OUT/cpu_$tag.json $OUT/cuda_$tag.json | tee $OUT/compare_$tag.txt
done
el "done"
