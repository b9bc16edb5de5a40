#!/usr/bin/env bash
# Installs ringzero into a scratch directory and builds a small consumer five ways, as a user
# would: pkg-config, CMake find_package, a Meson subproject, a plain -I, and a plain -I in the
# separate-compilation mode (docs/compile_time.md); where nvcc and NCCL are installed, also a GPU
# program with CMake's CUDA language (tests/install/consumer_cuda, the CMakeLists.txt docs/gpu.md
# quotes). Each consumer runs; a C++17 compile must fail
# with the message naming -std=c++20. The consumers compile at -O0: what is checked is that they
# build and run.
# Arguments: <meson build dir> <source dir>.
set -euo pipefail
build=$(cd "$1" && pwd)
source=$(cd "$2" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
meson install -C "$build" --destdir "$work/root" --no-rebuild --quiet >/dev/null
prefix=$(meson introspect "$build" --buildoptions | python3 -c 'import json,sys; print([o["value"] for o in json.load(sys.stdin) if o["name"]=="prefix"][0])')
root="$work/root$prefix"
pc=$(find "$root" -name ringzero.pc | head -n 1)
cmake_dir=$(dirname "$(find "$root" -name ringzeroConfig.cmake | head -n 1)")
test -n "$pc" && test -n "$cmake_dir"

echo "--- pkg-config"
flags=$(PKG_CONFIG_PATH=$(dirname "$pc") pkg-config --define-variable=prefix="$root" --cflags --libs ringzero)
g++ -O0 "$source/tests/install/consumer/main.cpp" $flags -o "$work/consumer_pc"
"$work/consumer_pc"

echo "--- CMake find_package"
cmake -S "$source/tests/install/consumer" -B "$work/cmake" -DCMAKE_PREFIX_PATH="$root" >/dev/null
cmake --build "$work/cmake" >/dev/null
"$work/cmake/consumer"

echo "--- Meson subproject"
mkdir -p "$work/sub/subprojects"
cp "$source/tests/install/consumer/meson.build" "$source/tests/install/consumer/main.cpp" "$work/sub/"
ln -s "$source" "$work/sub/subprojects/ringzero"
meson setup "$work/sub/build" "$work/sub" --wrap-mode=nodownload -Dringzero:tests=disabled >/dev/null
ninja -C "$work/sub/build" >/dev/null
"$work/sub/build/consumer"

echo "--- plain -I"
g++ -std=c++20 -O0 -I"$source/include" "$source/tests/install/consumer/main.cpp" -pthread -o "$work/consumer_plain"
"$work/consumer_plain"

echo "--- separate compilation (installed <ringzero/impl/src.hpp> in a .cpp of the consumer's own)"
inc=$(dirname "$(dirname "$(find "$root" -path '*/ringzero/ringzero.hpp' | head -n 1)")")
printf '#include <ringzero/impl/src.hpp>\n' >"$work/ringzero_core.cpp"
g++ -std=c++20 -O0 -DRINGZERO_SEPARATE_COMPILATION -I"$inc" -c "$work/ringzero_core.cpp" -o "$work/ringzero_core.o"
g++ -std=c++20 -O0 -DRINGZERO_SEPARATE_COMPILATION -I"$inc" "$source/tests/install/consumer/main.cpp" \
  "$work/ringzero_core.o" -pthread -o "$work/consumer_separate"
"$work/consumer_separate"

if command -v nvcc >/dev/null && [ -n "$(find -H /usr/local/cuda/lib64 /usr/lib/x86_64-linux-gnu -maxdepth 1 -name 'libnccl.so*' 2>/dev/null)" ]; then
  echo "--- CMake with CUDA and NCCL: docs/gpu.md's CMakeLists.txt, as written there"
  python3 - "$source/docs/gpu.md" "$source/tests/install/consumer_cuda/CMakeLists.txt" <<'PY'
import sys
doc, cmake = open(sys.argv[1]).read(), open(sys.argv[2]).read()
sys.exit(0 if "```cmake\n" + cmake + "```" in doc else "docs/gpu.md does not hold tests/install/consumer_cuda/CMakeLists.txt as written")
PY
  cmake -S "$source/tests/install/consumer_cuda" -B "$work/cmake_cuda" -DCMAKE_PREFIX_PATH="$root" >/dev/null
  cmake --build "$work/cmake_cuda" >/dev/null
  "$work/cmake_cuda/trainer"
fi

echo "--- C++17 refused at once, saying what to pass"
if g++ -std=c++17 -fsyntax-only -I"$inc" "$source/tests/install/consumer/main.cpp" 2>"$work/cxx17.err"; then
  echo "a C++17 compile of the consumer succeeded" >&2
  exit 1
fi
grep -q 'ringzero needs C++20: compile with -std=c++20' "$work/cxx17.err" || { cat "$work/cxx17.err" >&2; exit 1; }
echo ok
