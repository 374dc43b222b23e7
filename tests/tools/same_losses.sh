#!/usr/bin/env bash
# same_losses.sh [BASE_COMMIT] [BUILD_DIR]: builds zinfinity-train at BASE_COMMIT (default: the
# merge base with origin/main, else HEAD~1) in a scratch worktree, then trains the same configs
# with it and with BUILD_DIR's binary (default: build-release) and compares their loss logs byte
# for byte: configs/fashion-mnist{,-cpu,-nvme}.json for 200 steps, configs/gpt-small.json for 50
# and a 2-rank stage-3 run of fashion-mnist-nvme (where mpirun exists). A refactor that must not
# change behaviour passes it; it prints each comparison and exits non-zero on the first
# difference. Not part of ctest (it builds a second tree): run it by hand.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
base=${1:-$(git merge-base HEAD origin/main 2>/dev/null || git rev-parse HEAD~1)}
build=${2:-$root/build-release}
new_bin=$build/tools/zinfinity-train
[ -x "$new_bin" ] || { echo "same_losses: no $new_bin; build first" >&2; exit 1; }
scratch=$(mktemp -d /tmp/zinf-same-losses.XXXXXX)
trap 'git -C "$root" worktree remove --force "$scratch/tree" >/dev/null 2>&1 || true; rm -rf "$scratch"' EXIT
git worktree add -q --detach "$scratch/tree" "$base"
echo "same_losses: building zinfinity-train at $(git rev-parse --short "$base")"
cmake -S "$scratch/tree" -B "$scratch/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DZINF_WITH_CUDA=OFF -DZINF_WITH_PYTHON=OFF -DZINF_BUILD_TESTS=OFF \
  -DZINF_BUILD_MICROBENCH=OFF >"$scratch/configure.log" 2>&1 || { cat "$scratch/configure.log"; exit 1; }
cmake --build "$scratch/build" --target zinfinity-train -j "${ZINF_BUILD_JOBS:-$(nproc)}" >"$scratch/build.log" 2>&1 ||
  { tail -30 "$scratch/build.log"; exit 1; }
old_bin=$scratch/build/tools/zinfinity-train

# compare NAME LAUNCHER... -- ARGS...: one run of each binary, the loss logs compared.
compare() {
  local name=$1; shift
  local launcher=()
  while [ "$1" != -- ]; do launcher+=("$1"); shift; done
  shift
  for which in old new; do
    local bin=$old_bin; [ $which = new ] && bin=$new_bin
    rm -rf "$scratch/swap"
    "${launcher[@]}" "$bin" "$@" --set "zero_optimization.offload_param.nvme_path=$scratch/swap" \
      --set "zero_optimization.offload_optimizer.nvme_path=$scratch/swap" \
      --loss-log "$scratch/$name.$which" >"$scratch/$name.$which.out" 2>&1 ||
      { echo "same_losses: $name ($which) failed:"; tail -5 "$scratch/$name.$which.out"; exit 1; }
  done
  if cmp -s "$scratch/$name.old" "$scratch/$name.new"; then
    echo "same_losses: $name: identical ($(wc -l <"$scratch/$name.new") lines)"
  else
    echo "same_losses: $name: DIFFERENT"; diff "$scratch/$name.old" "$scratch/$name.new" | head; exit 1
  fi
}
for c in fashion-mnist fashion-mnist-cpu fashion-mnist-nvme; do
  compare "$c" -- --config "configs/$c.json" --set data.max_steps=200 --no-eval
done
compare gpt-small -- --config configs/gpt-small.json --set data.max_steps=50 --no-eval
if command -v mpirun >/dev/null 2>&1; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  compare fashion-mnist-nvme-2ranks mpirun -np 2 --oversubscribe -- \
    --config configs/fashion-mnist-nvme.json --set train_micro_batch_size_per_gpu=64 \
    --set data.max_steps=100 --no-eval
fi
echo "same_losses: every loss log identical to $(git rev-parse --short "$base")'s"
