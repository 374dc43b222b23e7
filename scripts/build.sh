#!/usr/bin/env bash
# build.sh DIR [--target NAME] [--] [cmake args...]: configures zinfinity in DIR with Ninja and
# builds it (everything, or the one target named).
set -euo pipefail
dir=$1; shift
target=()
if [ "${1:-}" = --target ]; then target=(--target "$2"); shift 2; fi
if [ "${1:-}" = -- ]; then shift; fi
root=$(cd "$(dirname "$0")/.." && pwd)
jobs=${ZINF_BUILD_JOBS:-$(nproc)}
cmake -S "$root" -B "$dir" -G Ninja "$@" >"$dir.configure.log" 2>&1 || { cat "$dir.configure.log"; exit 1; }
grep -E "^-- zinfinity:" "$dir.configure.log" || true
cmake --build "$dir" -j "$jobs" "${target[@]}"
