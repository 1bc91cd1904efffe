#!/usr/bin/env bash
# One device call for the prefill chunk chosen without --prefill-chunk (results under $OUT): the
# ds4-cuda device tests while $FLASH (flash:30 on an 80 GB card, flash on an H200) is synthesized, then
# ds4-bench's sweep (ctx 512 -> 32768) without --prefill-chunk and with --prefill-chunk 4096 / 256; with
# device-bin/mid-ds4.xz + mid-ds4-bench.xz (a previous build) a 2-stage route of each build (issue 29);
# with device-bin/mid-bench.xz that build's sweep at 4096 interleaved with this one's (an A/B); PROFILE=1
# adds both builds' per-kernel prefill profile at 4096.
# Run: bench/cuda/auto_chunk_session.sh (it unpacks device-bin/bins.tar.xz). FLASH=flash:12 synthesizes
# fewer layers (a kernel A/B in less device time); CTX_START/CTX_MAX/GEN narrow the sweep.
# Results gather in /tmp/res and are packed into $OUT/results.tgz after each step (a call cut short
# still brings back what was done).
DEST=${OUT:-/tmp/out}; OUT=/tmp/res; mkdir -p $OUT $DEST
pack() { tar -czf $DEST/results.tgz -C $OUT .; }
tar -xJf device-bin/bins.tar.xz
export DS4_WEIGHTS=mmap LD_LIBRARY_PATH=/usr/local/cuda/lib64 DS4_CUDA_INCLUDE=/usr/local/cuda/include DS4_CUDA_CACHE=/tmp/ds4cache
F=${FLASH:-$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1 | awk '{print ($1>100000)?"flash":"flash:30"}')}
M=/dev/shm/${F/:/}.gguf
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $OUT/gpu.txt
(timeout 300 device-bin/ds4-gguf synth $F $M --mix q2 > /tmp/synth.log 2>&1) & SP=$!
[ -z "${NO_TESTS:-}" ] && DS4_TEST_DIR=/dev/shm timeout 200 device-bin/device-tests --nocapture --test-threads 1 > $OUT/device_tests.log 2>&1
grep -E "^test .*FAILED|test result|panicked" $OUT/device_tests.log
wait $SP; tail -1 /tmp/synth.log; pack
cat README.md README.md README.md > /tmp/prompt.txt
# With device-bin/mid-bench.xz (a previous build's ds4-bench) its sweep at 4096 too, interleaved: an A/B.
# (mid2-bench.xz: a second previous build, swept the same way.)
for m in mid mid2; do [ -f device-bin/$m-bench.xz ] && xz -dc device-bin/$m-bench.xz > /tmp/$m-bench && chmod +x /tmp/$m-bench; done
for c in ${SWEEPS:-auto 4096 mid4096 mid2_4096 256 4096b mid4096b mid2_4096b}; do
  bin=device-bin/ds4-bench; case $c in mid2*) bin=/tmp/mid2-bench ;; mid*) bin=/tmp/mid-bench ;; esac
  [ -x $bin ] || continue
  flag=; [ $c != auto ] && flag="--prefill-chunk $(echo ${c#mid2} | tr -dc 0-9)"
  timeout 200 $bin -m $M --prompt-file /tmp/prompt.txt --ctx-start ${CTX_START:-512} --ctx-max ${CTX_MAX:-32768} --step-mul 8 --gen-tokens ${GEN:-64} \
    --backend cuda --mem-limit-gb 200 $flag --csv $OUT/sweep_$c.csv > $OUT/sweep_$c.log 2>&1
  echo "== $c"; grep -h "prefill chunk\|GPU plan" $OUT/sweep_$c.log; cat $OUT/sweep_$c.csv; pack
done
if [ -n "${PROFILE:-}" ]; then
  # Prefill of one 4096-token chunk kernel by kernel (CUDA events), this build and the previous one.
  for bin in device-bin/ds4-bench /tmp/mid-bench; do
    [ -x $bin ] || continue
    f=$OUT/profile_$(basename $(dirname $bin))_4096.txt
    DS4_CUDA_PROFILE=1 timeout 120 $bin -m $M --prompt-file /tmp/prompt.txt --ctx-start 4096 --ctx-max 4096 --gen-tokens 4 \
      --prefill-chunk 4096 --backend cuda 2>&1 | grep -v uploading > $f
    echo "== profile $bin"; grep -A12 "prefill:" $f | head -14; pack
  done
fi
if [ -f device-bin/mid-ds4.xz ] && [ -z "${NO_ROUTE:-}" ]; then
  # Issue 29: a 2-stage route (32-bit) of the previous build (mid-ds4*.xz) and of this one, same file.
  mkdir -p /tmp/midb && for b in ds4 ds4-bench; do xz -dc device-bin/mid-$b.xz > /tmp/midb/$b && chmod +x /tmp/midb/$b; done
  L=${F#flash:}; [ "$L" = flash ] && L=43
  for b in /tmp/midb device-bin; do
    n=$(basename $b)
    B=$b M=$M SPLIT=$(( L / 2 - 1 + L % 2 )) BACKEND=cuda PCHUNK_RUNS=0 GEN=64 RT=150 CHUNK=4096 OUT=$OUT/route_$n CSV=$OUT/route_$n/route_gpu.csv \
      bash bench/dist/route_vs_single.sh 32 2>&1 | grep -E "ratio|identical|DIFFER" | cut -c1-200
    grep -h "telemetry.*prefill" $OUT/route_$n/route_bits32.log | cut -c1-220; pack
  done
fi
pack
