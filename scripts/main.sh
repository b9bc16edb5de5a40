#!/usr/bin/env bash
# The main job: installs missing Debian packages, builds ringzero (release) and trains the
# Fashion-MNIST MLP (examples/01_ddp_fashion_mnist) for a few epochs on 1 rank and then on 2 ranks
# of the local backend with the same global batch, printing per-epoch wall time, test accuracy
# and the speedup of 2 ranks over 1 side by side (the data-parallel homework: same accuracy,
# wall-clock speedup close to the number of workers).
# Extra arguments go to the trainer (e.g. --epochs 10, --optimizer adamw, --compress bf16); the
# defaults below (--compare-ranks 1,2 --epochs 3) are passed only for options not given here.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install_deps.sh
echo "main.sh: building the trainer in build-release (about two minutes the first time)"
if [ ! -f build-release/build.ninja ]; then
  meson setup build-release -Dbuildtype=release >/dev/null
fi
ninja -C build-release examples/ddp_fashion_mnist >/dev/null
# Pass a default only when the user did not give that option (CLI11 refuses an option given twice).
given() {  # given OPTION ARGS...: is OPTION (or OPTION=VALUE) among ARGS?
  local option=$1 arg
  shift
  for arg in "$@"; do
    case $arg in "$option" | "$option"=*) return 0 ;; esac
  done
  return 1
}
defaults=()
given --compare-ranks "$@" || defaults+=(--compare-ranks 1,2)
given --epochs "$@" || defaults+=(--epochs 3)
exec ./build-release/examples/ddp_fashion_mnist "${defaults[@]}" "$@"
