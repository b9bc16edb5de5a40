#!/usr/bin/env bash
# The main job: installs missing Debian packages, builds ringzero (release) and runs the
# all_reduce benchmark on 2 ranks of the local backend, from 8 B to 256 MiB, checking every
# result bitwise and comparing with the machine's memory bandwidth.
# Extra arguments are passed to ringzero-bench (e.g. --ranks 4, -d all).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install_deps.sh
if [ ! -f build-release/build.ninja ]; then
  meson setup build-release -Dbuildtype=release >/dev/null
fi
ninja -C build-release bench/ringzero-bench >/dev/null
exec ./build-release/bench/ringzero-bench all_reduce -b 8 -e 256M -f 4 -n 20 -w 5 -c 1 -d float -o sum --ranks 2 "$@"
