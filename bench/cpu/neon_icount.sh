#!/usr/bin/env bash
# Executed aarch64 instructions per 4096-column row dot, scalar vs NEON kernel table, counted from
# qemu-user's instruction trace (one instruction per translation block): a compute-cost proxy for
# hardware this machine cannot time. Needs qemu-user, gcc-aarch64-linux-gnu, libc6-dev-arm64-cross
# and `rustup target add aarch64-unknown-linux-gnu`. Output: type,isa,instructions_per_row.
set -euo pipefail
cd "$(dirname "$0")/../.."
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc
cargo build -q --release -p ds4-quant --example kernel_icount --target aarch64-unknown-linux-gnu
BIN=target/aarch64-unknown-linux-gnu/release/examples/kernel_icount
LOG=$(mktemp)
trap 'rm -f "$LOG"' EXIT
count() {
  qemu-aarch64 -cpu max -L /usr/aarch64-linux-gnu -singlestep -d nochain,exec -D "$LOG" "$BIN" "$@" >/dev/null
  grep -c Trace "$LOG"
}
echo "type,isa,instructions_per_row"
for ty in q8_0 q2_k q4_k iq2_xxs f16; do
  for isa in scalar neon; do
    c0=$(count $ty $isa 0)
    c8=$(count $ty $isa 8)
    echo "$ty,$isa,$(( (c8 - c0) / 8 ))"
  done
done
