#!/usr/bin/env bash
# compare-loss-logs.sh BEFORE AFTER [STEPS]: runs two zinfinity-train binaries (say, one built
# before a refactor and one after) on the shipped Fashion-MNIST configs without offload, with the
# optimizer on the CPU and with parameters and states on NVMe, STEPS optimizer steps each
# (default 200), and checks that every micro-step's loss is byte-identical (the --loss-log holds
# each loss's fp32 bits). Exit status 0 when all three match. Bitwise results hold on one
# machine (the SIMD variant and OpenBLAS's kernels differ between CPUs): run both binaries here.
set -euo pipefail
if [ $# -lt 2 ]; then
  echo "usage: $0 BEFORE_BINARY AFTER_BINARY [STEPS]" >&2
  exit 2
fi
before=$1 after=$2 steps=${3:-200}
root=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d /tmp/zinf-compare-XXXXXX)
trap 'rm -rf "$work"' EXIT
status=0
for config in fashion-mnist.json fashion-mnist-cpu.json fashion-mnist-nvme.json; do
  for side in before after; do
    bin=$before
    [ "$side" = after ] && bin=$after
    mkdir -p "$work/swap-$side"
    "$bin" --config "$root/configs/$config" --max-steps "$steps" --no-eval \
      --set "zero_optimization.offload_param.nvme_path=$work/swap-$side" \
      --set "zero_optimization.offload_optimizer.nvme_path=$work/swap-$side" \
      --loss-log "$work/$config.$side" >"$work/$config.$side.out" 2>&1 ||
      { echo "$config: $side run failed:"; tail -5 "$work/$config.$side.out"; exit 1; }
  done
  lines=$(wc -l <"$work/$config.after")
  if cmp -s "$work/$config.before" "$work/$config.after"; then
    echo "$config: $lines micro-steps, losses byte-identical ($(sha256sum <"$work/$config.after" | cut -c1-16))"
  else
    echo "$config: losses DIFFER"
    diff "$work/$config.before" "$work/$config.after" | head -5
    status=1
  fi
done
exit $status
