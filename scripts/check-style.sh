#!/usr/bin/env bash
# check-style.sh [--format-only | --tidy-only] [--since COMMIT] [BUILD_DIR]
#
# The house's two style checks, run before committing (scripts/run-tests.sh runs them in CI):
#   format  clang-format (the repo's .clang-format, 100 columns) over every tracked C++ file;
#           a file it would change fails the check (fix: clang-format -i FILE).
#   tidy    clang-tidy (the repo's .clang-tidy: bugprone-*, performance-*, a few readability-*)
#           over the .cc files of BUILD_DIR's compile_commands.json (default build-release);
#           any warning fails. With --since COMMIT only the files changed since COMMIT (and
#           those not committed yet) are tidied: what CI does, from the commit recorded in
#           .ci/tidy-base (the last tree checked whole), so that it stays within its time.
# Debian's clang-format and clang-tidy (14): scripts/install-deps.sh installs them.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
do_format=1 do_tidy=1 since=""
while [ $# -gt 0 ]; do
  case "$1" in
    --format-only) do_tidy=0 ;;
    --tidy-only) do_format=0 ;;
    --since) since=$2; shift ;;
    -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
    *) break ;;
  esac
  shift
done
build=${1:-build-release}
jobs=${ZINF_BUILD_JOBS:-$(nproc)}
status=0

cxx_files() { git ls-files '*.cc' '*.h' '*.cu' '*.cuh'; }

if [ "$do_format" = 1 ]; then
  bad=$(cxx_files | xargs -P "$jobs" -n 16 clang-format --dry-run --Werror 2>&1 |
        sed -n 's/^\([^:]*\):[0-9]*:[0-9]*: error: code should be clang-formatted.*/\1/p' | sort -u ||
        true)
  if [ -n "$bad" ]; then
    echo "check-style: clang-format would change $(echo "$bad" | wc -l) file(s):"
    echo "$bad" | sed 's/^/  /'
    echo "  (fix: clang-format -i FILE...)"
    status=1
  else
    echo "check-style: clang-format: $(cxx_files | wc -l) files clean"
  fi
fi

if [ "$do_tidy" = 1 ]; then
  db=$build/compile_commands.json
  [ -f "$db" ] || { echo "check-style: no $db; build first (scripts/build.sh $build ...)" >&2; exit 2; }
  # The project's .cc files the build compiles (not the build tree's generated ones).
  all=$(python3 -c "
import json, os, sys
root = os.path.realpath(sys.argv[1])
for e in json.load(open(sys.argv[2])):
    f = os.path.realpath(os.path.join(e['directory'], e['file']))
    # The GPU tests' shared helper (tests/kernels/cuda/cuda_test_util.h) uses GCC's _Float16,
    # which clang 14 lacks on x86-64: the files that include it are left to the compiler.
    rel = f[len(root):]
    if f.endswith('.cc') and f.startswith(root + '/') and '/build' not in rel \
            and 'cuda_test_util.h' not in open(f, errors='replace').read():
        print(os.path.relpath(f, root))
" "$root" "$db" | sort -u)
  files=$all
  if [ -n "$since" ]; then
    if git cat-file -e "$since^{commit}" 2>/dev/null; then
      changed=$( (git diff --name-only "$since" -- '*.cc' '*.h'; git ls-files --others --exclude-standard '*.cc') | sort -u)
      # A header's change is tidied through the .cc files of its folder.
      dirs=$(echo "$changed" | { grep '\.h$' || true; } | xargs -r -n1 dirname | sort -u)
      files=$(echo "$all" | grep -Fx -f <(echo "$changed") || true)
      for d in $dirs; do files=$(printf '%s\n%s\n' "$files" "$(echo "$all" | grep "^$d/[^/]*\.cc$" || true)"); done
      files=$(echo "$files" | sed '/^$/d' | sort -u)
    else
      echo "check-style: $since is not a commit here; tidying every file"
    fi
  fi
  count=$(echo "$files" | sed '/^$/d' | wc -l)
  if [ "$count" = 0 ]; then
    echo "check-style: clang-tidy: no file to check"
  else
    out=$(mktemp)
    # clang-tidy exits non-zero on findings; the wrapper keeps xargs from stopping there.
    echo "$files" | xargs -P "$jobs" -n 4 sh -c 'clang-tidy -p "$0" --quiet "$@" || true' "$build" \
      >"$out" 2>&1
    warnings=$(grep -E "(warning|error): .*\[[a-z0-9.,-]+\]$" "$out" | sort -u || true)
    if [ -n "$warnings" ]; then
      echo "check-style: clang-tidy: $(echo "$warnings" | wc -l) finding(s) in $count file(s):"
      echo "$warnings" | sed "s|^$root/||; s/^/  /"
      status=1
    else
      echo "check-style: clang-tidy: $count file(s) clean"
    fi
    rm -f "$out"
  fi
fi
exit $status
