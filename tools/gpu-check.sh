#!/usr/bin/env bash
# tools/gpu-check.sh: the GPU check of zinfinity, in two halves.
#
#   tools/gpu-check.sh build     here (Debian, nvcc, no GPU): builds with CUDA for the H200
#                                (sm_90) and gathers what must travel into gpu-bundle/ (git-ignored):
#                                the GPU test binaries, zinfinity-bench, zinfinity-train when it
#                                exists, the Debian shared libraries they need (packed with them into
#                                payload.tar.xz) and the Fashion-MNIST dataset. Fails when the
#                                working tree plus the bundle would exceed the 64 MiB the device tool
#                                carries.
#   tools/gpu-check.sh --dry-run build, then check here what the GPU machine will do: every binary's
#                                libraries resolve from the bundle (only libcuda.so.1 may be missing,
#                                the driver brings it) and the GPU tests skip cleanly without a GPU.
#   tools/gpu-check.sh run       there (the lent GPU machine, from the repo root, gpu-bundle carried):
#                                runs the GPU tests, the h2d bandwidth bench (pinned pool against
#                                cudaMemcpy from cudaHostAlloc), `zinfinity-bench swap` on the GPU,
#                                one Fashion-MNIST epoch on the GPU and the same epoch on that
#                                machine's CPU device (first losses and accuracies compared), each
#                                under `timeout`, all within 5 minutes; prints a summary table, and
#                                writes everything to $OUT/gpu-check.txt when $OUT is set.
#
# Device tool call: command "bash tools/gpu-check.sh run", carry ["gpu-bundle"], timeout_s 420.
set -uo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

bundle=gpu-bundle
build_dir=${ZINF_GPU_BUILD_DIR:-build-gpu}
stage=$build_dir/bundle-stage
transfer_limit_bytes=$((64 * 1024 * 1024))
# Room kept below the limit for files others add to the tree before the call.
transfer_margin_bytes=$((2 * 1024 * 1024))
dataset_dir=${ZINF_FASHION_MNIST_DIR:-/usr/share/datasets/fashion-mnist}

log() { printf '[gpu-check] %s\n' "$*"; }
die() { printf '[gpu-check] error: %s\n' "$*" >&2; exit 1; }

# Libraries never bundled: the C runtime (every Linux has its own, and it must match the loader)
# and the CUDA libraries, which the GPU machine has matching its driver (cuBLAS and NCCL are also
# far too large to carry).
is_system_lib() {
  case "$1" in
    linux-vdso.so*|ld-linux*|libc.so*|libm.so*|libpthread.so*|libdl.so*|librt.so*) return 0 ;;
    libcuda.so*|libcudart.so*|libcublas.so*|libcublasLt.so*|libnccl.so*|libnvidia*) return 0 ;;
  esac
  return 1
}

# ---------------------------------------------------------------------------------------------
# build: compile for sm_90 and gather the bundle.
# ---------------------------------------------------------------------------------------------
gpu_test_names() {
  # The tests labelled gpu (not slow), from ctest's own listing; zinf_add_test names each test
  # after its executable target.
  ctest --test-dir "$build_dir" -N --show-only=json-v1 2>/dev/null | python3 -c '
import json, sys
for test in json.load(sys.stdin).get("tests", []):
    labels = []
    for prop in test.get("properties", []):
        if prop.get("name") == "LABELS":
            labels = prop.get("value", [])
    if "gpu" in labels and "slow" not in labels:
        print(test["name"])
'
}

do_build() {
  command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ] || die "nvcc not found"
  log "configuring $build_dir (Release, CUDA on, sm_90)"
  mkdir -p "$build_dir"  # the log lives inside it: a file beside it would travel with the tree
  cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DZINF_WITH_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES=90 -DZINF_BUILD_MICROBENCH=OFF >"$build_dir/gpu-check-configure.log" 2>&1 ||
    { cat "$build_dir/gpu-check-configure.log"; die "cmake configure failed"; }
  grep -E "^-- zinfinity:" "$build_dir/gpu-check-configure.log" || true

  mapfile -t tests < <(gpu_test_names)
  [ ${#tests[@]} -gt 0 ] || die "ctest lists no test labelled gpu in $build_dir"
  # The CPU optimizer tests travel too: the GPU machine's CPU has AVX-512, which the development
  # machines may lack, so the AVX-512 variant is checked there.
  cpu_tests=(kernels_cpu_features_test kernels_cast_test kernels_grad_stats_test kernels_optimizer_test)
  targets=("${tests[@]}" "${cpu_tests[@]}" zinfinity-bench)
  if grep -q "zinfinity-train" "$build_dir/build.ninja" 2>/dev/null; then targets+=(zinfinity-train); fi
  log "building ${targets[*]}"
  cmake --build "$build_dir" -j "${ZINF_BUILD_JOBS:-$(nproc)}" --target "${targets[@]}" ||
    die "build failed"

  rm -rf "$stage" "$bundle"
  mkdir -p "$stage/bin" "$stage/lib/compat" "$bundle/data"
  for t in "${tests[@]}"; do
    exe=$(find "$build_dir" -type f -name "$t" -perm -u+x -print -quit)
    [ -n "$exe" ] || die "built test $t not found under $build_dir"
    cp "$exe" "$stage/bin/"
  done
  printf '%s\n' "${tests[@]}" >"$stage/bin/gpu-tests.txt"
  for t in "${cpu_tests[@]}"; do
    exe=$(find "$build_dir" -type f -name "$t" -perm -u+x -print -quit)
    [ -n "$exe" ] || die "built test $t not found under $build_dir"
    cp "$exe" "$stage/bin/"
  done
  printf '%s\n' "${cpu_tests[@]}" >"$stage/bin/cpu-tests.txt"
  find "$build_dir" -type f -name zinfinity-bench -perm -u+x -exec cp {} "$stage/bin/" \; -quit
  find "$build_dir" -type f -name zinfinity-train -perm -u+x -exec cp {} "$stage/bin/" \; -quit
  for f in "$stage"/bin/*; do
    [ "${f##*.}" = txt ] && continue
    strip --strip-unneeded "$f" || die "strip $f"
  done

  # The shared libraries the binaries need (ldd resolves the whole closure), minus the system
  # and CUDA ones. libstdc++ and libgcc_s go to lib/compat: used there only when the machine's own
  # are missing or older than GCC 12's (Debian's libstdc++ needs glibc 2.36, which an older
  # machine lacks, so it is not forced on a machine whose own libstdc++ is new enough).
  for f in "$stage"/bin/*; do
    [ "${f##*.}" = txt ] && continue
    ldd "$f" | awk '/=>/ && $3 ~ /^\// {print $1, $3}'
  done | sort -u | while read -r name path; do
    if is_system_lib "$name"; then continue; fi
    dest=$stage/lib
    case "$name" in libstdc++.so*|libgcc_s.so*) dest=$stage/lib/compat ;; esac
    cp -L "$path" "$dest/$name"
    chmod u+w "$dest/$name"
    strip --strip-unneeded "$dest/$name" 2>/dev/null || true
  done

  # One compressed payload: OpenBLAS alone is 36 MB, the dataset 30 MB, so loose files would not
  # fit in the 64 MiB the device tool carries; xz brings the binaries and libraries to a fraction.
  log "packing $bundle/payload.tar.xz"
  tar -C "$stage" -cf - bin lib | xz -T0 -6 >"$bundle/payload.tar.xz" || die "packing failed"
  if [ -d "$dataset_dir" ]; then
    mkdir -p "$bundle/data/fashion-mnist"
    cp "$dataset_dir"/*-ubyte.gz "$bundle/data/fashion-mnist/"
  else
    log "warning: no dataset at $dataset_dir; the training step will be skipped there"
  fi
  {
    echo "built $(date -u +%FT%TZ) on $(uname -n) from $(git rev-parse --short HEAD 2>/dev/null)$(git diff --quiet 2>/dev/null || echo +changes)"
    echo "cuda archs 90; nvcc $(nvcc --version 2>/dev/null | tail -1)"
    echo "payload:"; (cd "$stage" && find bin lib -type f -printf '  %p %s\n' | sort)
  } >"$bundle/MANIFEST.txt"

  # The transfer: tracked and untracked-not-ignored files of the tree, plus the carried bundle.
  local tree_bytes bundle_bytes total
  tree_bytes=$(git ls-files -co --exclude-standard -z | du -cb --files0-from=- 2>/dev/null | tail -1 | cut -f1)
  bundle_bytes=$(du -cb "$bundle" | tail -1 | cut -f1)
  total=$((tree_bytes + bundle_bytes))
  log "bundle $(numfmt --to=iec "$bundle_bytes") (payload $(numfmt --to=iec "$(stat -c %s "$bundle/payload.tar.xz")"), staged $(du -sh "$stage" | cut -f1) unpacked) + working tree $(numfmt --to=iec "$tree_bytes") = $(numfmt --to=iec "$total") of $(numfmt --to=iec $transfer_limit_bytes)"
  if [ "$total" -gt $((transfer_limit_bytes - transfer_margin_bytes)) ]; then
    die "the transfer ($total bytes) exceeds the device tool's limit less a 2 MiB margin"
  fi
  log "bundle ready: device tool command 'bash tools/gpu-check.sh run', carry [\"$bundle\"]"
}

# ---------------------------------------------------------------------------------------------
# dry run: the checks that need no GPU.
# ---------------------------------------------------------------------------------------------
do_dry_run() {
  do_build
  local failed=0
  log "checking that every binary's libraries resolve from the bundle"
  for f in "$stage"/bin/*; do
    [ "${f##*.}" = txt ] && continue
    missing=$(LD_LIBRARY_PATH="$stage/lib:$stage/lib/compat" ldd "$f" 2>&1 |
              awk '/not found/ {print $1}' | grep -v '^libcuda\.so\.1$' || true)
    if [ -n "$missing" ]; then
      log "  $(basename "$f"): not found: $missing"
      failed=1
    else
      log "  $(basename "$f"): ok"
    fi
  done
  log "running the GPU test binaries here, where they must skip cleanly"
  while read -r t; do
    out=$(LD_LIBRARY_PATH="$stage/lib:$stage/lib/compat" timeout 120 "$stage/bin/$t" 2>&1)
    rc=$?
    skipped=$(printf '%s\n' "$out" | sed -n 's/^\[  SKIPPED \] \([0-9]*\) test.*/\1/p' | tail -1)
    skipped=${skipped:-0}
    reason=$(printf '%s\n' "$out" | grep -m1 -o 'no CUDA device: .*' || true)
    if [ $rc -ne 0 ]; then
      log "  $t: FAILED (exit $rc)"; printf '%s\n' "$out" | tail -20; failed=1
    elif [ "$skipped" -eq 0 ] && [ -z "$reason" ]; then
      log "  $t: ok (exit 0, nothing skipped: a GPU is present?)"
    else
      log "  $t: ok, $skipped skipped (${reason:-no reason printed})"
    fi
  done <"$stage/bin/gpu-tests.txt"
  [ $failed -eq 0 ] || die "dry run failed"
  log "dry run passed"
}

# ---------------------------------------------------------------------------------------------
# run: on the GPU machine.
# ---------------------------------------------------------------------------------------------
do_run() {
  local budget_s=${ZINF_GPU_CHECK_BUDGET_S:-285}
  local start_s now_s
  start_s=$(date +%s)
  local report=${OUT:+$OUT/gpu-check.txt}
  if [ -n "$report" ]; then
    mkdir -p "$OUT"
    exec > >(tee "$report") 2>&1
  fi
  [ -f "$bundle/payload.tar.xz" ] || die "no $bundle/payload.tar.xz: run 'tools/gpu-check.sh build' first and carry $bundle"
  local unpack=${TMPDIR:-/tmp}/zinf-gpu-bundle
  rm -rf "$unpack" && mkdir -p "$unpack"
  if command -v xz >/dev/null 2>&1; then
    xz -dc "$bundle/payload.tar.xz" | tar -C "$unpack" -xf - || die "unpacking the payload failed"
  else
    python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1], "r:xz").extractall(sys.argv[2])' \
      "$bundle/payload.tar.xz" "$unpack" || die "unpacking the payload failed (no xz, python3 failed)"
  fi
  local bin=$unpack/bin
  # The bundle's libraries apply to the bundle's binaries only (run_bin), never to this machine's
  # own tools (nvidia-smi, python3).
  libpath="$unpack/lib"
  run_bin() { LD_LIBRARY_PATH="$libpath${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$@"; }
  ldd_problems() {
    for f in "$bin"/*; do [ "${f##*.}" = txt ] || run_bin ldd "$f" 2>&1; done |
      grep -E 'not found' | grep -v 'libcuda\.so\.1' || true
  }

  log "$(date -u +%FT%TZ) on $(uname -n), $(nproc) cores, glibc $(getconf GNU_LIBC_VERSION 2>/dev/null)"
  sed -n 1,2p "$bundle/MANIFEST.txt"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 || true

  # The CUDA libraries the binaries expect from this machine (libcudart, cuBLAS, NCCL): where
  # the loader does not find them, look in the usual places, PyTorch's wheels included.
  # libstdc++ / libgcc_s: this machine's own when new enough, else the bundle's (lib/compat).
  if ldd_problems | grep -qE 'libstdc\+\+|libgcc_s|GLIBCXX|CXXABI'; then
    libpath="$libpath:$unpack/lib/compat"
    log "using the bundled libstdc++ (this machine's is missing or older than GCC 12's)"
  fi
  local need
  need=$(ldd_problems | awk '$2 == "=>" {print $1}' | sort -u)
  for lib in $need; do
    # The toolkit first, then Python's CUDA wheels (nvidia-nccl-cu13 sits under a venv in /opt).
    dir=$(find /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/local/cuda*/lib64 \
            /usr/lib/x86_64-linux-gnu /usr/local/nvidia/lib64 -maxdepth 2 -name "$lib" -print -quit \
            2>/dev/null | xargs -r dirname)
    [ -n "$dir" ] || dir=$(find /opt /usr/local/lib /usr/lib/python3* -maxdepth 10 -name "$lib" \
            -print -quit 2>/dev/null | xargs -r dirname)
    if [ -n "$dir" ]; then
      libpath="$libpath:$dir"
      log "found $lib in $dir"
    else
      log "warning: $lib not found on this machine"
    fi
  done
  problems=$(ldd_problems)
  [ -z "$problems" ] || { log "unresolved after the search:"; printf '%s\n' "$problems" | sort -u | head -20; }

  # NCCL says why when a one-rank communicator cannot start (no usable socket interface, say).
  export NCCL_DEBUG=${NCCL_DEBUG:-WARN}

  # The dataset where the configs expect it.
  if [ ! -e "$dataset_dir" ] && [ -d "$bundle/data/fashion-mnist" ]; then
    mkdir -p "$(dirname "$dataset_dir")" 2>/dev/null &&
      ln -sfn "$root/$bundle/data/fashion-mnist" "$dataset_dir" 2>/dev/null ||
      log "warning: could not link $dataset_dir to the bundle's dataset"
  fi
  export ZINF_FASHION_MNIST_DIR="$root/$bundle/data/fashion-mnist"

  summary=()
  add() { summary+=("$(printf '%-34s %-8s %s' "$1" "$2" "$3")"); }
  # Seconds a step may take: its own cap, or what is left of the budget.
  step_timeout() {
    now_s=$(date +%s)
    local left=$((budget_s - (now_s - start_s)))
    [ "$left" -lt "$1" ] && echo "$left" || echo "$1"
  }

  # 1. GPU tests.
  while read -r t; do
    local limit; limit=$(step_timeout 75)
    if [ "$limit" -lt 10 ]; then add "test $t" skipped "no time left"; continue; fi
    log "== $t (timeout ${limit}s)"
    out=$(run_bin timeout "$limit" "$bin/$t" 2>&1); rc=$?
    if [ $rc -ne 0 ]; then
      # A failure: the whole assertion messages (what, expected, actual, traces), not a summary.
      printf '%s\n' "$out" | grep -vE '^\[       OK \]|^\[ RUN      \]|^\[zinf' | head -120
    else
      printf '%s\n' "$out" | grep -E '^\[  (FAILED|SKIPPED|PASSED) |^\[==========\]|Failure|error|no CUDA' | head -60
    fi
    passed=$(printf '%s\n' "$out" | sed -n 's/^\[  PASSED  \] \([0-9]*\) test.*/\1/p' | tail -1)
    skipped=$(printf '%s\n' "$out" | sed -n 's/^\[  SKIPPED \] \([0-9]*\) test.*/\1/p' | tail -1)
    failedn=$(printf '%s\n' "$out" | sed -n 's/^\[  FAILED  \] \([0-9]*\) test.*/\1/p' | tail -1)
    figure="${passed:-0} passed, ${skipped:-0} skipped, ${failedn:-0} failed"
    if [ $rc -eq 124 ]; then add "test $t" failed "timed out after ${limit}s; $figure"
    elif [ $rc -ne 0 ]; then add "test $t" failed "exit $rc; $figure"
    elif [ "${skipped:-0}" -gt 0 ] && printf '%s\n' "$out" | grep -q 'no CUDA device'; then
      add "test $t" failed "skipped on the GPU machine: $(printf '%s\n' "$out" | grep -m1 -o 'no CUDA device: .*')"
    else add "test $t" ok "$figure"; fi
  done <"$bin/gpu-tests.txt"

  # 2. h2d / d2h GB/s: pinned pool against cudaMemcpy from cudaHostAlloc, 256 MiB, 10 reps.
  limit=$(step_timeout 60)
  if ! run_bin "$bin/zinfinity-bench" --help 2>&1 | grep -qE '^  h2d '; then
    add "bench h2d" skipped "zinfinity-bench has no h2d command"
  elif [ "$limit" -lt 10 ]; then add "bench h2d" skipped "no time left"
  else
    log "== zinfinity-bench h2d --size 256MiB --reps 10 (timeout ${limit}s)"
    out=$(run_bin timeout "$limit" "$bin/zinfinity-bench" h2d --size 256MiB --buffer-size 64MiB --reps 10 2>&1); rc=$?
    printf '%s\n' "$out"
    line=$(printf '%s\n' "$out" | grep '^h2d-summary' || true)
    if [ $rc -eq 0 ] && [ -n "$line" ]; then
      v() { printf '%s\n' "$line" | sed -n "s/.*$1=\([0-9.]*\).*/\1/p"; }
      add "bench h2d (pool vs cudaMemcpy)" ok "h2d $(v h2d_pool_gbps) vs $(v h2d_baseline_gbps) GB/s; d2h $(v d2h_pool_gbps) vs $(v d2h_baseline_gbps) GB/s (medians)"
    else add "bench h2d (pool vs cudaMemcpy)" failed "exit $rc"; fi
  fi

  # 1b. CPU optimizer tests and the AdamW bench on this machine's CPU (AVX-512 where present).
  log "== CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-); avx512f: $(grep -c -m1 avx512f /proc/cpuinfo)"
  if [ -f "$bin/cpu-tests.txt" ]; then
    while read -r t; do
      limit=$(step_timeout 40)
      if [ "$limit" -lt 10 ]; then add "cpu test $t" skipped "no time left"; continue; fi
      out=$(run_bin timeout "$limit" "$bin/$t" 2>&1); rc=$?
      printf '%s\n' "$out" | grep -E '^\[  (FAILED|SKIPPED|PASSED) |^\[==========\]|Failure' | head -20
      passed=$(printf '%s\n' "$out" | sed -n 's/^\[  PASSED  \] \([0-9]*\) test.*/\1/p' | tail -1)
      skipped=$(printf '%s\n' "$out" | sed -n 's/^\[  SKIPPED \] \([0-9]*\) test.*/\1/p' | tail -1)
      if [ $rc -eq 0 ]; then add "cpu test $t" ok "${passed:-0} passed, ${skipped:-0} skipped"
      else add "cpu test $t" failed "exit $rc"; fi
    done <"$bin/cpu-tests.txt"
    for vg in avx512:fp32 avx512:bf16 avx2:fp32; do
      variant=${vg%%:*}; g=${vg##*:}; {
        limit=$(step_timeout 45)
        if [ "$limit" -lt 15 ]; then add "bench adam $variant $g" skipped "no time left"; continue; fi
        out=$(run_bin timeout "$limit" "$bin/zinfinity-bench" adam --params 256M --grad-dtype $g \
                --variant $variant --threads 2 --pairs 5 --no-scalar 2>&1); rc=$?
        printf '%s\n' "$out" | tail -8
        ratio=$(printf '%s\n' "$out" | grep -iE 'ratio|median' | tail -1 | sed 's/^ *//' | cut -c1-90)
        if [ $rc -eq 0 ]; then add "bench adam $variant $g 2 thr" ok "$ratio"
        else add "bench adam $variant $g 2 thr" failed "exit $rc"; fi
      }
    done
  fi

  # 3. zinfinity-bench swap with the device tier on the GPU.
  limit=$(step_timeout 60)
  swap_help=$(run_bin "$bin/zinfinity-bench" swap --help 2>&1 || true)
  if ! run_bin "$bin/zinfinity-bench" --help 2>&1 | grep -qE '^  swap '; then
    add "bench swap --device cuda" skipped "zinfinity-bench has no swap command"
  elif ! printf '%s\n' "$swap_help" | grep -qE -- '(^|[[:space:]])--device([[:space:]]|=|$)'; then
    add "bench swap --device cuda" skipped "zinfinity-bench swap has no --device flag (CPU device only)"
  elif [ "$limit" -lt 10 ]; then add "bench swap --device cuda" skipped "no time left"
  else
    log "== zinfinity-bench swap --device cuda (timeout ${limit}s)"
    mkdir -p /tmp/zinf-swap-check
    out=$(run_bin timeout "$limit" "$bin/zinfinity-bench" swap --device cuda --path /tmp/zinf-swap-check \
            --model-size 4GiB --progress off 2>&1); rc=$?
    printf '%s\n' "$out" | tail -30
    if [ $rc -eq 0 ]; then add "bench swap --device cuda" ok "$(printf '%s\n' "$out" | grep -m1 -iE 'GB/s' | sed 's/^ *//' | cut -c1-80)"
    else add "bench swap --device cuda" failed "exit $rc"; fi
  fi

  # 4. Fashion-MNIST training with the NVMe config on the GPU, one epoch, then the same epoch on
  # this machine's CPU device: the GPU's cuBLAS sums in another order, so the losses are not
  # bitwise equal, but the first step's loss must agree closely and the test accuracies within a
  # point or two; a kernel that drops or misplaces elements shows in both.
  limit=$(step_timeout 110)
  config=configs/fashion-mnist-nvme.json
  train_flags=(--config "$config" --set data.epochs=1 --progress off)
  if [ ! -x "$bin/zinfinity-train" ]; then add "train fashion-mnist (cuda)" skipped "zinfinity-train not built"
  elif [ ! -f "$config" ]; then add "train fashion-mnist (cuda)" skipped "no $config"
  elif [ "$limit" -lt 20 ]; then add "train fashion-mnist (cuda)" skipped "no time left"
  else
    local work=${TMPDIR:-/tmp}/zinf-gpu-train
    rm -rf "$work" && mkdir -p "$work"
    log "== zinfinity-train ${train_flags[*]} --set device.type=cuda (timeout ${limit}s)"
    out=$(run_bin timeout "$limit" "$bin/zinfinity-train" "${train_flags[@]}" --set device.type=cuda \
            --loss-log "$work/cuda.loss" 2>&1); rc=$?
    printf '%s\n' "$out" | tail -25
    acc_cuda=$(printf '%s\n' "$out" | sed -n 's/^summary:.*test accuracy \([0-9.]*\) %.*/\1/p' | tail -1)
    last=$(printf '%s\n' "$out" | grep -E '^summary:' | tail -1 | cut -c1-90)
    if [ $rc -eq 124 ]; then add "train fashion-mnist (cuda)" failed "timed out after ${limit}s; ${last}"
    elif [ $rc -ne 0 ]; then add "train fashion-mnist (cuda)" failed "exit $rc; $(printf '%s\n' "$out" | grep -m1 -iE 'error' | cut -c1-80)"
    elif [ -z "$acc_cuda" ]; then add "train fashion-mnist (cuda)" failed "finished without a test accuracy in its summary"
    else
      add "train fashion-mnist (cuda)" ok "${last:-finished}"
      limit=$(step_timeout 80)
      if [ "$limit" -lt 20 ]; then add "train fashion-mnist (cpu, to compare)" skipped "no time left"
      else
        log "== zinfinity-train ${train_flags[*]} on this machine's CPU device, to compare (timeout ${limit}s)"
        out=$(run_bin timeout "$limit" "$bin/zinfinity-train" "${train_flags[@]}" --set device.type=cpu \
                --set zero_optimization.offload_param.nvme_path=/tmp/zinfinity-swap-cpu \
                --set zero_optimization.offload_optimizer.nvme_path=/tmp/zinfinity-swap-cpu \
                --loss-log "$work/cpu.loss" 2>&1); rc=$?
        printf '%s\n' "$out" | grep -E '^summary:' | tail -1
        acc_cpu=$(printf '%s\n' "$out" | sed -n 's/^summary:.*test accuracy \([0-9.]*\) %.*/\1/p' | tail -1)
        if [ $rc -ne 0 ] || [ -z "$acc_cpu" ]; then
          add "train fashion-mnist (cpu, to compare)" failed "exit $rc; accuracy '${acc_cpu}'"
        else
          # Step 1's loss (the same initial parameters and batch), the largest relative loss
          # difference over the first 20 steps, and the accuracy difference.
          cmp=$(awk -v acc_cuda="$acc_cuda" -v acc_cpu="$acc_cpu" '
            NR == FNR { cuda[$1] = $2; next }
            ($1 in cuda) && $1 <= 20 {
              d = cuda[$1] - $2; if (d < 0) d = -d; r = d / ($2 > 0 ? $2 : 1)
              if (r > worst) worst = r
              if ($1 == 1) first = r
            }
            END {
              da = acc_cuda - acc_cpu; if (da < 0) da = -da
              ok = (first != "" && first < 1e-4 && worst < 2e-2 && da < 2.0) ? "ok" : "failed"
              printf "%s accuracy cuda %s %% vs cpu %s %%; step-1 loss rel diff %.2g, steps 1-20 max %.2g\n", ok, acc_cuda, acc_cpu, first, worst
            }' "$work/cuda.loss" "$work/cpu.loss")
          # Anything but "ok ..." (awk failed, a loss file missing) is a failure.
          result=${cmp%% *}
          [ "$result" = ok ] || result=failed
          add "train fashion-mnist cuda vs cpu" "$result" "${cmp#* }"
        fi
      fi
    fi
    rm -rf "$work" /tmp/zinfinity-swap-cpu /tmp/zinfinity-swap
  fi

  now_s=$(date +%s)
  echo
  echo "== gpu-check summary ($((now_s - start_s)) s)"
  printf '%-34s %-8s %s\n' step result figure
  local any_failed=0
  for s in "${summary[@]}"; do
    echo "$s"
    case "$s" in *" failed "*) any_failed=1 ;; esac
  done
  return $any_failed
}

case "${1:-}" in
  build) do_build ;;
  --dry-run|dry-run) do_dry_run ;;
  run) do_run ;;
  *) echo "usage: tools/gpu-check.sh build | --dry-run | run" >&2; exit 2 ;;
esac
