#!/usr/bin/env bash
# update-config-doc.sh [BUILD_DIR]: regenerates the key list in docs/CONFIG.md from the key table
# the config loader uses (src/base/config_keys.cc), through `zinfinity-train --config-keys`.
# base_test's ConfigKeys.ConfigDocListsEveryKeyFromTheTable fails until the doc matches.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}
bin=$build/tools/zinfinity-train
[ -x "$bin" ] || { echo "update-config-doc: no $bin; build first (scripts/build.sh $build)" >&2; exit 1; }
doc=$root/docs/CONFIG.md
table=$(mktemp)
trap 'rm -f "$table"' EXIT
"$bin" --config-keys >"$table"
awk -v table="$table" '
  /^<!-- BEGIN KEY TABLE/ { print; while ((getline line < table) > 0) print line; skip = 1; next }
  /^<!-- END KEY TABLE -->/ { skip = 0 }
  !skip { print }
' "$doc" >"$doc.new"
mv "$doc.new" "$doc"
echo "update-config-doc: $(grep -c '^| `' "$table") keys written to docs/CONFIG.md"
