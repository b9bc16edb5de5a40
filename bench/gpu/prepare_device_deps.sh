#!/usr/bin/env bash
# Collects, from THIS machine, what bench/gpu/device_check.sh needs on a bare GPU machine that
# has no network (CUDA, NCCL and a C++ compiler are expected there; these are not): the
# header-only libraries of the tests and benchmarks (doctest, CLI11, nlohmann_json, fmt), the
# headers of the example trainers (Eigen, zlib, and xxhash for their checkpoint code), and the
# Fashion-MNIST files.
#
#   bench/gpu/prepare_device_deps.sh [DEST]      # default DEST: .device-deps in the repository
#
# DEST is added to .git/info/exclude so git ignores it; name it in the run's carry list so it
# travels with the working tree (about 42 MiB, under the 64 MiB a run may carry). Nothing here
# is vendored into the repository: the folder is a transient copy of this machine's packages.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
dest=${1:-$root/.device-deps}
mkdir -p "$dest/include" "$dest/data/fashion-mnist"
copied=()
copy_dir() {  # copy_dir SRC NAME: /usr/include/SRC -> DEST/include/NAME
  if [ -d "/usr/include/$1" ]; then
    rm -rf "$dest/include/$2"
    mkdir -p "$(dirname "$dest/include/$2")"
    cp -r "/usr/include/$1" "$dest/include/$2"
    copied+=("$2")
  else
    echo "prepare_device_deps: /usr/include/$1 not found (install its -dev package); skipped" >&2
  fi
}
copy_dir doctest doctest
copy_dir CLI CLI
copy_dir nlohmann nlohmann
copy_dir fmt fmt
copy_dir eigen3/Eigen eigen3/Eigen
for h in zlib.h zconf.h xxhash.h; do
  if [ -f "/usr/include/$h" ]; then cp "/usr/include/$h" "$dest/include/"; copied+=("$h"); fi
done
for f in train-images-idx3-ubyte.gz train-labels-idx1-ubyte.gz t10k-images-idx3-ubyte.gz t10k-labels-idx1-ubyte.gz; do
  if [ -f "/usr/share/datasets/fashion-mnist/$f" ]; then
    cp "/usr/share/datasets/fashion-mnist/$f" "$dest/data/fashion-mnist/"
  else
    echo "prepare_device_deps: /usr/share/datasets/fashion-mnist/$f not found (package dataset-fashion-mnist); skipped" >&2
  fi
done
copied+=("fashion-mnist")
if [ -d "$root/.git" ] || [ -f "$root/.git" ]; then
  exclude=$(git -C "$root" rev-parse --git-path info/exclude)
  case "$dest" in
    "$root"/*) rel="/${dest#"$root"/}/" ;;
    *) rel="" ;;
  esac
  if [ -n "$rel" ] && ! grep -qxF "$rel" "$exclude" 2>/dev/null; then
    mkdir -p "$(dirname "$exclude")"
    echo "$rel" >> "$exclude"
  fi
fi
echo "prepare_device_deps: $dest holds: ${copied[*]} ($(du -sh "$dest" | cut -f1))"
echo "prepare_device_deps: carry it with the run, e.g. carry: [\"${dest#"$root"/}\"]"
