#!/usr/bin/env bash
# Builds the binaries bench/cuda/device_run.sh runs on the lent GPU (no Rust there) into device-bin/
# (git-ignored; pass it in the device call's `carry`).
set -euo pipefail
cd "$(dirname "$0")/../.."
mkdir -p device-bin
# Both GPU backends in one binary: bench/wgpu/h200.sh compares them in one call.
cargo build --release -p ds4-cli --features "cuda wgpu" --bin ds4-bench --bin ds4-gguf --bin ds4
cargo build --release -p ds4-server --features "cuda wgpu"
cargo build --release -p ds4-cuda --features cuda --example gpu_bench
cargo build --release -p ds4-wgpu --example wgpu_kernel_bench
cargo build --release -p ds4-engine --features "cuda wgpu" --example mtp_step_costs
T=${CARGO_TARGET_DIR:-target}/release
cp $T/ds4-bench $T/ds4-gguf $T/ds4 $T/ds4-server $T/examples/gpu_bench $T/examples/mtp_step_costs device-bin/ && cp $T/examples/wgpu_kernel_bench device-bin/kernel_bench
exe() { cargo test --release "$@" --no-run --message-format=json 2>/dev/null | python3 -c 'import sys,json
for l in sys.stdin:
    m=json.loads(l)
    if m.get("reason")=="compiler-artifact" and m.get("executable") and m["target"]["kind"]==["test"]: print(m["executable"])' | tail -1; }
cp "$(exe -p ds4-cuda --features cuda --test device)" device-bin/device-tests
cp "$(exe -p ds4-engine --features cuda --test cuda_pipeline)" device-bin/engine-tests
cp "$(exe -p ds4-engine --features cuda --test decode_batch_cuda)" device-bin/engine-batch-tests
# MTP on CUDA: greedy identity with speculation, and the GPU drafter against the CPU block.
cp "$(exe -p ds4-engine --features cuda --test mtp_cuda)" device-bin/engine-mtp-tests
cp "$(exe -p ds4-engine --features cuda --test mtp_drafter_cuda)" device-bin/engine-drafter-tests
# Per-module NVRTC compile times on the device's cores (bench/cuda/cold_start.sh runs it).
cp "$(exe -p ds4-cuda --features cuda --test nvrtc_compile)" device-bin/nvrtc-tests
# The wgpu ops and the whole stage against the CPU, on the GPU through Vulkan (bench/wgpu/h200.sh).
for t in ops_matvec ops_attention ops_ffn stage; do cp "$(exe -p ds4-wgpu --test $t)" device-bin/wgpu-$t-tests; done
strip device-bin/* 2>/dev/null || true
# One compressed file to carry (the device call carries at most 64 MiB with the tree): unpack there
# with `tar -xJf device-bin/bins.tar.xz`.
rm -f device-bin/bins.tar.xz
tar -cJf /tmp/ds4-bins.tar.xz $(find device-bin -maxdepth 1 -type f ! -name '*.tar.xz') && mv /tmp/ds4-bins.tar.xz device-bin/bins.tar.xz
ls -la device-bin
