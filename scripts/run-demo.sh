#!/usr/bin/env bash
# Installs what the main job needs, builds zinfinity-train (Release) and runs the main job with
# its default settings: Fashion-MNIST with the parameters and the optimizer states offloaded to
# NVMe (configs/fashion-mnist-nvme.json: 4 epochs, a few minutes on 2 cores), printing progress,
# I/O figures and the test accuracy after each epoch. Extra arguments go to zinfinity-train
# (e.g. --set data.epochs=1).
#
# Only the trainer is built (no tests, benchmarks or Python package: scripts/run-tests.sh builds
# those), and the CUDA code only where a GPU answers (nvidia-smi) or ZINF_WITH_CUDA=ON asks.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
bash scripts/install-deps.sh train
cuda=${ZINF_WITH_CUDA:-}
if [ -z "$cuda" ]; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    cuda=AUTO
  else
    cuda=OFF
  fi
fi
bash scripts/build.sh build --target zinfinity-train -- -DCMAKE_BUILD_TYPE=Release \
  -DZINF_WITH_CUDA="$cuda" -DZINF_WITH_PYTHON=OFF -DZINF_BUILD_TESTS=OFF \
  -DZINF_BUILD_MICROBENCH=OFF
./build/tools/zinfinity-train --config configs/fashion-mnist-nvme.json "$@"
