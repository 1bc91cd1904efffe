# Sourced at the start of a one-call device session script: results gather in /tmp/res and
# `pack` writes them to $OUT/results.tgz (call it after each step: a call cut short still brings back
# what was done); `el` logs a step with the seconds since the start; the carried binaries are
# unpacked into device-bin/ ($B) and the CUDA environment is set.
DEST=${OUT:-/tmp/out}; OUT=/tmp/res; mkdir -p $OUT $DEST
pack() { tar -czf $DEST/results.tgz -C $OUT .; }
T0=$(date +%s); el() { echo "[+$(( $(date +%s) - T0 ))s] $*" | tee -a $OUT/steps.log; }
tar -xJf device-bin/bins.tar.xz
B=device-bin
export DS4_WEIGHTS=mmap LD_LIBRARY_PATH=/usr/local/cuda/lib64 DS4_CUDA_INCLUDE=/usr/local/cuda/include DS4_CUDA_CACHE=/tmp/ds4cache
# batch_rates MODEL GEN "CASES" [TAG]: CUDA batched decode at ctx 4096 (one 4096-token chunk), GEN tokens a
# stream, for each case N (default kernels) or Nd (--deterministic), appended to $OUT/batching.csv
# (header written when missing); stderr of each run in $OUT/batch_<case><TAG>.err.
batch_rates() {
  local m=$1 gen=$2 tag=${4:-} c n det mode r
  [ -f $OUT/batching.csv ] || echo "mode,ctx_tokens,prefill_tokens,prefill_tps,gen_tokens,gen_tps,kvcache_bytes,streams,aggregate_gen_tps,per_stream_gen_tps" > $OUT/batching.csv
  for c in $3; do
    n=${c%d}; det=; mode=default; [ "$c" != "$n" ] && { det=--deterministic; mode=deterministic; }
    r=$(timeout 100 $B/ds4-bench -m $m --prompt-file /tmp/prompt.txt --backend cuda --ctx-start 4096 --ctx-max 4096 --gen-tokens $gen \
        --prefill-chunk 4096 --mem-limit-gb 200 --concurrency $n $det 2>$OUT/batch_$c$tag.err | grep "^4096,")
    echo "$mode,$r" | tee -a $OUT/batching.csv
  done
}
