#!/usr/bin/env bash
# build.sh DIR [cmake args...]: configures (once) and builds zinfinity in DIR with Ninja.
set -euo pipefail
dir=$1; shift
root=$(cd "$(dirname "$0")/.." && pwd)
jobs=${ZINF_BUILD_JOBS:-$(nproc)}
cmake -S "$root" -B "$dir" -G Ninja "$@" >"$dir.configure.log" 2>&1 || { cat "$dir.configure.log"; exit 1; }
grep -E "^-- zinfinity:" "$dir.configure.log" || true
cmake --build "$dir" -j "$jobs"
