#!/usr/bin/env bash
# Installs every build, test and run dependency of zinfinity from Debian packages (Debian 12,
# as root). Quick when everything is already there. CUDA and NCCL are not Debian packages: they
# are used where installed under /usr/local/cuda and never required.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config git
  liburing-dev libaio-dev libtbb-dev libhwloc-dev libxxhash-dev zlib1g-dev libopenblas-dev
  nlohmann-json3-dev libgtest-dev libgmock-dev libbenchmark-dev
  # libpng: the captioned prediction grid of zinfinity-train --predict.
  libpng-dev
  fio util-linux procps
  dataset-fashion-mnist
  # The text corpus of the GPT model (byte-level): /usr/share/games/fortunes.
  fortunes
  # MPI: several ranks (mpirun -np N zinfinity-train), the MPI communicator of CPU ranks and
  # the NCCL bootstrap of GPU ranks.
  libopenmpi-dev openmpi-bin
  # The Python package (python/): pybind11 and the headers to build it; PyTorch, NumPy and
  # pytest to use and test it with Debian's python3.
  python3-dev pybind11-dev python3-torch python3-numpy python3-pytest
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#packages[@]} packages present"
  exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
  echo "install-deps: missing packages: ${missing[*]}; run as root (or: sudo $0)" >&2
  exit 1
fi

echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}"
