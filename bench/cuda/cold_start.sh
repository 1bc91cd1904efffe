#!/usr/bin/env bash
# Process start to ready on the lent GPU, with an empty kernel cache (cold: every module compiled by
# NVRTC) and with the cache that run filled (warm), the model file in the page cache both times.
# "Ready" is ds4-server answering 200 on /health; then one 1-token chat request is timed as well
# (the first real answer). Prints one line per run and the server's own timing lines.
#
# Binaries: bench/cuda/build_device_bin.sh (device-bin/ds4-server, ds4-gguf; nvrtc-tests optional),
# carried in the device call. Usage on the device, from the repo root:
#   bench/cuda/cold_start.sh                      # device-bin, Flash q2 (43 layers), 2 cold + 2 warm runs
#   BINS="device-bin device-bin-old" bench/cuda/cold_start.sh   # several builds, interleaved
#   M=/dev/shm/flash6.gguf REPS=3 bench/cuda/cold_start.sh
#   BACKEND=cpu M=tiny.gguf bench/cuda/cold_start.sh   # smoke test of the script without a GPU
set -u
export DS4_WEIGHTS=mmap LD_LIBRARY_PATH=/usr/local/cuda/lib64 DS4_CUDA_INCLUDE=/usr/local/cuda/include
BINS=${BINS:-device-bin}
M=${M:-/dev/shm/flash.gguf}
REPS=${REPS:-2}
CTX=${CTX:-4096}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
first=${BINS%% *}
if [ ! -f "$M" ]; then
  echo "synth $M (Flash q2)"
  timeout 300 "$first/ds4-gguf" synth flash "$M" --mix q2 2>&1 | tail -1 || exit 1
fi
# The model in the page cache before any timed run.
cat "$M" > /dev/null
nproc; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader

# One run: prints "ready_s first_token_s" (or FAILED) and leaves the server log in $OUT.
run() { # bin cache_dir label
  python3 - "$1/ds4-server" "$M" "$2" "$CTX" "$OUT/cold_start_$3.log" <<'EOF'
import json, os, socket, subprocess, sys, time, urllib.request
bin_, model, cache, ctx, logf = sys.argv[1:]
with socket.socket() as s:
    s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]
env = dict(os.environ, DS4_CUDA_CACHE=cache)
log = open(logf, "w")
t0 = time.monotonic()
p = subprocess.Popen([bin_, "-m", model, "--host", "127.0.0.1", "--port", str(port), "--backend", os.environ.get("BACKEND", "cuda"), "--ctx", ctx, "--kv-snapshots", "0"],
                     stdout=log, stderr=subprocess.STDOUT, env=env)
base = f"http://127.0.0.1:{port}"
ready = None
while time.monotonic() - t0 < 300:
    if p.poll() is not None:
        break
    try:
        with urllib.request.urlopen(base + "/health", timeout=2) as r:
            if r.status == 200:
                ready = time.monotonic() - t0
                break
    except Exception:
        time.sleep(0.05)
first = None
if ready is not None:
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1, "temperature": 0}).encode()
    req = urllib.request.Request(base + "/v1/chat/completions", data=body, headers={"content-type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            r.read()
        first = time.monotonic() - t0
    except Exception as e:
        print("request failed:", e, file=sys.stderr)
p.terminate()
try:
    p.wait(30)
except Exception:
    p.kill()
log.close()
if ready is None:
    print("FAILED (see " + logf + ")")
else:
    print(f"{ready:.2f} {first:.2f}" if first is not None else f"{ready:.2f} FAILED")
EOF
}

echo "build kind run ready_s first_token_s"
for rep in $(seq 1 "$REPS"); do
  for b in $BINS; do
    cache=$(mktemp -d /tmp/ds4-kcache.XXXXXX)
    tag=$(basename "$b")_$rep
    echo "$b cold $rep $(run "$b" "$cache" "${tag}_cold")"
    grep -a -E "cuda: compiled|resident in" "$OUT/cold_start_${tag}_cold.log" | sed 's/^/    /'
    echo "$b warm $rep $(run "$b" "$cache" "${tag}_warm")"
    grep -a -E "cuda: compiled|resident in" "$OUT/cold_start_${tag}_warm.log" | sed 's/^/    /'
    ls "$cache" | wc -l | sed 's/^/    cache entries: /'
    rm -rf "$cache"
  done
done

# Compile times per module on this machine's cores (no GPU needed), when the test binary was carried.
if [ -x "$first/nvrtc-tests" ]; then
  DS4_CUDA_LIB=/usr/local/cuda/lib64 timeout 300 "$first/nvrtc-tests" compile_times --ignored --nocapture 2>&1 | tr -d '\000' | grep -a -E "module|modules|thread" | tee "$OUT/compile_times.log"
fi
