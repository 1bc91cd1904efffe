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
