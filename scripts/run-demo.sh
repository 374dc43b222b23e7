#!/usr/bin/env bash
# Installs the dependencies, builds zinfinity (Release) and runs the main job with its default
# settings: zinfinity-bench io writes, then reads, a 2 GiB file in build/scratch and prints GB/s.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
bash scripts/install-deps.sh
bash scripts/build.sh build -DCMAKE_BUILD_TYPE=Release
mkdir -p build/scratch
./build/tools/zinfinity-bench io --path build/scratch --size 2GiB --op write,read "$@"
