#!/usr/bin/env bash
# Builds the tests of io/, swap/, src/tier and src/engine with ThreadSanitizer (RelWithDebInfo, no
# CUDA) in build-tsan and runs them; exits non-zero on any failure and on any TSan report. Not
# part of scripts/run-tests.sh: this build and run add about 12 minutes on 2 cores, past what CI
# allows. Tests labelled `slow` are left out unless ZINF_TEST_SLOW=1.
#
# oneTBB is the one thing suppressed (tests/tsan.supp): Debian's libtbb is not instrumented, so
# TSan cannot see the fork and join of its parallel loops. Only the test targets are built (the
# tools and the other tests are not needed here and would double the build time).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
bash scripts/install-deps.sh

dir=build-tsan
label_args=(-LE slow)
if [ "${ZINF_TEST_SLOW:-0}" = 1 ]; then label_args=(); fi
jobs=${ZINF_BUILD_JOBS:-$(nproc)}
# The tests of the layers with threads of their own: io workers, the CPU device's copy thread,
# the swapper's pipelines and the engine over all of them, with oneTBB beside them.
tests='^(io|swap|tier|engine)_[a-z_]*test$'

start=$(date +%s)
echo "== TSan build (no CUDA)"
# Configured as scripts/build.sh does, but only the test targets are built.
cmake -S "$root" -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DZINF_WITH_CUDA=OFF \
  -DZINF_SANITIZE=thread -DZINF_BUILD_MICROBENCH=OFF -DZINF_WERROR=ON \
  >"$dir.configure.log" 2>&1 || { cat "$dir.configure.log"; exit 1; }
grep -E "^-- zinfinity:" "$dir.configure.log" || true
mapfile -t targets < <(ninja -C "$dir" -t targets all | sed -n 's/^\([a-z_]*\): phony$/\1/p' |
                       grep -E "$tests")
if [ ${#targets[@]} -eq 0 ]; then echo "run-tsan: no test targets matched $tests" >&2; exit 1; fi
cmake --build "$dir" -j "$jobs" --target "${targets[@]}"

echo "== TSan tests: ${targets[*]}"
# Reports also go to files (log_path), so that one from a child process (the swap tests' kill -9
# children) or one a test survives still fails the run. halt_on_error stops a test at its first.
logs="$root/$dir/tsan-logs"
rm -rf "$logs"
mkdir -p "$logs"
status=0
TSAN_OPTIONS="suppressions=$root/tests/tsan.supp halt_on_error=1 second_deadlock_stack=1 log_path=$logs/tsan" \
  ctest --test-dir "$dir" --output-on-failure -j "$jobs" -R "$tests" "${label_args[@]}" || status=$?
if compgen -G "$logs/tsan.*" >/dev/null; then
  echo "== TSan reports"
  cat "$logs"/tsan.*
  status=1
fi
if [ "$status" -ne 0 ]; then
  echo "== TSan run failed after $(( $(date +%s) - start )) s" >&2
  exit "$status"
fi
echo "== TSan tests passed, no reports, in $(( $(date +%s) - start )) s"
