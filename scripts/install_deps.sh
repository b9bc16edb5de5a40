#!/usr/bin/env bash
# Installs the Debian 12 packages ringzero's build, tests, benchmarks and examples use, when they
# are missing. Needs root (or sudo). Safe to run repeatedly: it installs nothing when all are there.
set -euo pipefail

packages=(
  g++ meson ninja-build pkg-config cmake
  doctest-dev libfmt-dev libcli11-dev nlohmann-json3-dev
  zlib1g-dev libeigen3-dev dataset-fashion-mnist
  libxxhash-dev  # XXH3 checksums of the checkpoint layer (include/ringzero/checkpoint/)
  python3-venv   # tests/checkpoint: a virtual environment with Python's safetensors package
  libopenmpi-dev openmpi-bin
  jq  # the summaries of bench/ddp_fashion_mnist.sh and bench/zero_fashion_mnist.sh
  python3-matplotlib  # bench/plot.py: busbw against size from result files (and its test)
  libtorch-dev  # examples 03 and 04 (libtorch trainers) and the 'torch' test suite
  fortunes  # example 04's corpus: the text in /usr/share/games/fortunes
  clang-format  # the 'format' test: every source laid out as .clang-format says
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

as_root=()
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1; then as_root=(sudo); else
    echo "ringzero: these packages are missing and installing them needs root: ${missing[*]}" >&2
    exit 1
  fi
fi
echo "ringzero: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
"${as_root[@]}" apt-get update -qq
"${as_root[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
