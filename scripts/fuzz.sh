#!/usr/bin/env bash
# fuzz.sh [--seeds N] [--first S] [--seed S --verbose] [--jobs J] [BUILD_DIR via ZINF_BUILD]:
# the config fuzzer (scripts/fuzz.py) over zinfinity-train of ZINF_BUILD (default build-release;
# built here if missing). CI runs 30 fixed seeds (ctest config_fuzz_test); run more by hand:
#   bash scripts/fuzz.sh --seeds 500
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${ZINF_BUILD:-$root/build-release}
if [ ! -x "$build/tools/zinfinity-train" ]; then
  bash "$root/scripts/build.sh" "$build" --target zinfinity-train
fi
exec /usr/bin/python3 "$root/scripts/fuzz.py" --train "$build/tools/zinfinity-train" "$@"
