#!/usr/bin/env bash
# install-deps.sh [train|all]: installs zinfinity's dependencies from Debian packages (Debian 12,
# as root). `train` (what scripts/run-demo.sh needs): the compiler, the libraries
# zinfinity-train links and its data. `all` (the default; scripts/run-tests.sh): also MPI, the
# Python package's build and test packages, the test and benchmark libraries, fio and the style
# tools. Quick when everything is already there. CUDA and NCCL are not Debian packages: they are
# used where installed under /usr/local/cuda and never required.
set -euo pipefail
set_name=${1:-all}

train_packages=(
  build-essential cmake ninja-build pkg-config
  liburing-dev libaio-dev libtbb-dev libhwloc-dev libxxhash-dev zlib1g-dev libopenblas-dev
  nlohmann-json3-dev
  # libpng: the captioned prediction grid of zinfinity-train --predict.
  libpng-dev
  dataset-fashion-mnist
  # The text corpus of the GPT model (byte-level): /usr/share/games/fortunes.
  fortunes
)
more_packages=(
  git libgtest-dev libgmock-dev libbenchmark-dev
  fio util-linux procps
  # MPI: several ranks (mpirun -np N zinfinity-train), the MPI communicator of CPU ranks and
  # the NCCL bootstrap of GPU ranks.
  libopenmpi-dev openmpi-bin
  # The Python package (python/): pybind11 and the headers to build it; PyTorch, NumPy and
  # pytest to use and test it with Debian's python3.
  python3-dev pybind11-dev python3-torch python3-numpy python3-pytest
  # The DeepSpeed examples of the PyTorch front end (examples/ds_train.py, ds_eval.py): the
  # Fashion-MNIST dataset class and the PNG of a test image.
  python3-torchvision python3-pil
  # The style checks (scripts/check-style.sh; .clang-format, .clang-tidy).
  clang-format clang-tidy
)

case "$set_name" in
  train) packages=("${train_packages[@]}") ;;
  all) packages=("${train_packages[@]}" "${more_packages[@]}") ;;
  *) echo "install-deps: unknown set '$set_name' (train or all)" >&2; exit 2 ;;
esac

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#packages[@]} packages of the '$set_name' set present"
  exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
  echo "install-deps: missing packages: ${missing[*]}; run as root (or: sudo $0 $set_name)" >&2
  exit 1
fi

echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}"
