#!/usr/bin/env bash
# Builds device-bin/bins.tar.xz for bench/ab_session.sh (and bench/h200_session.sh) here:
#  - this tree's ds4-bench, ds4-gguf, mtp_step_costs, gpu_bench, kernel_bench, the ds4-cuda device tests, the engine's
#    CUDA MTP and batch tests (engine-*-tests) and the wgpu op and
#    stage tests;
#  - base-bench: ds4-bench of $BASE (required: the commit to compare against), the "before" of the
#    Vulkan and prefill A/Bs, with base-kernel_bench and base-mtp_step_costs of the same build;
#    (BASE_BINS=<dir> instead: that directory's base-* files, e.g. kept from an earlier build's
#    /tmp/ds4-ab-bins/device-bin, and nothing of the base is built);
#  - with WIP=<ref> only: wip-bench and wip-device-tests, this tree with the CUDA kernel files
#    ($KERNELS) of that ref, the candidate of a CUDA kernel A/B. (The last one, the ldmatrix
#    fragments and per-128 loads of d973a23^, measured no gain on an H200 on 2026-12-07 and was
#    dropped: bench/results/cuda/README.md.)
# Each other build runs in a git worktree under /tmp with its own target directory
# (/tmp/ds4-ab-target): cargo keeps a workspace crate's source paths relative to the workspace, so a
# tree elsewhere sharing this target directory would pass its artifacts off as this tree's.
# Usage: BASE=<commit> [WIP=<ref>] bench/build_ab_bins.sh
# A candidate kept as a patch (bench/candidates/*.patch) is measured from a worktree with it applied:
#   git worktree add --detach /tmp/cand main && cd /tmp/cand && git apply bench/candidates/X.patch \
#     && BASE=main bench/build_ab_bins.sh && cp device-bin/bins.tar.xz /work/main/device-bin/
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
: "${BASE:=}"; [ -n "$BASE" ] || [ -n "${BASE_BINS:-}" ] || { echo "set BASE to the commit to compare against (or BASE_BINS)"; exit 2; }
WIP=${WIP:-}
KERNELS="crates/cuda/src/attention_tc.cu crates/cuda/src/moe_gemm.cu crates/cuda/src/tensor_core.cuh"
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
T=$CARGO_TARGET_DIR/release
S=/tmp/ds4-ab-bins/device-bin; rm -rf /tmp/ds4-ab-bins; mkdir -p $S
test_exe() { cargo test --release "$@" --no-run --message-format=json 2>/dev/null | python3 -c 'import sys,json
for l in sys.stdin:
    m=json.loads(l)
    if m.get("reason")=="compiler-artifact" and m.get("executable") and m["target"]["kind"]==["test"]: print(m["executable"])' | tail -1; }
# ds4-bench as $1, wgpu's kernel_bench as ${1%-bench}-kernel_bench (e.g. base-kernel_bench) and
# the MTP step costs as ${1%-bench}-mtp_step_costs.
bench_of() {
  cargo build --release -p ds4-cli --features "cuda wgpu" --bin ds4-bench && cp $T/ds4-bench $S/$1 || return 1
  cargo build --release -p ds4-engine --features "cuda wgpu" --example mtp_step_costs && cp $T/examples/mtp_step_costs $S/${1%-bench}-mtp_step_costs
  # (The example was named kernel_bench before 2026-12-07.)
  if cargo build --release -p ds4-wgpu --example wgpu_kernel_bench 2>/dev/null; then cp $T/examples/wgpu_kernel_bench $S/${1%-bench}-kernel_bench
  elif cargo build --release -p ds4-wgpu --example kernel_bench; then cp $T/examples/kernel_bench $S/${1%-bench}-kernel_bench; fi
}
# Another tree at $1 (with $2's kernel files when given), its ds4-bench as $3 and (with $4) its
# device tests as $4.
other() {
  local wt=/tmp/ds4-ab-tree; git worktree remove --force $wt 2>/dev/null || true
  git worktree add --detach $wt $1 >/dev/null
  [ -n "$2" ] && (cd $wt && git checkout $2 -- $KERNELS)
  (cd $wt && export CARGO_TARGET_DIR=/tmp/ds4-ab-target T=/tmp/ds4-ab-target/release && bench_of $3 \
     && { [ -z "${4:-}" ] || cp "$(test_exe -p ds4-cuda --features cuda --test device)" $S/$4; })
  git worktree remove --force $wt
}
export -f bench_of test_exe; export S T
if [ -n "${BASE_BINS:-}" ]; then cp "$BASE_BINS"/base-* $S/; else other $BASE "" base-bench; fi
[ -z "$WIP" ] || other HEAD $WIP wip-bench wip-device-tests
# This tree last, so target/release holds its binaries afterwards.
cargo build --release -p ds4-cli --features "cuda wgpu" --bin ds4-bench --bin ds4-gguf
cargo build --release -p ds4-engine --features "cuda wgpu" --example mtp_step_costs
cargo build --release -p ds4-cuda --features cuda --example gpu_bench
cargo build --release -p ds4-wgpu --example wgpu_kernel_bench
cp $T/ds4-bench $T/ds4-gguf $T/examples/mtp_step_costs $T/examples/gpu_bench $S/ && cp $T/examples/wgpu_kernel_bench $S/kernel_bench
cp "$(test_exe -p ds4-cuda --features cuda --test device)" $S/device-tests
for t in ops_attention ops_ffn stage; do cp "$(test_exe -p ds4-wgpu --test $t)" $S/wgpu-$t-tests; done
# The engine's CUDA tests of MTP (verify rows, rollback) and batched sessions (exact rows).
for t in mtp_cuda decode_batch_cuda; do cp "$(test_exe -p ds4-engine --features cuda --test $t)" $S/engine-$t-tests; done
strip $S/*
mkdir -p device-bin && tar -cJf device-bin/bins.tar.xz -C /tmp/ds4-ab-bins device-bin
ls -la device-bin/bins.tar.xz
