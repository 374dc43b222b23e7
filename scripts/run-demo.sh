#!/usr/bin/env bash
# Installs the dependencies, builds zinfinity (Release) and runs the main job with its default
# settings: zinfinity-train on Fashion-MNIST with the parameters and the optimizer states offloaded
# to NVMe (configs/fashion-mnist-nvme.json: 4 epochs, a few minutes on 2 cores), printing
# progress, I/O figures and the test accuracy after each epoch. Extra arguments go to
# zinfinity-train (e.g. --set data.epochs=1).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
bash scripts/install-deps.sh
bash scripts/build.sh build -DCMAKE_BUILD_TYPE=Release
./build/tools/zinfinity-train --config configs/fashion-mnist-nvme.json "$@"
