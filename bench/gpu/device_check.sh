#!/usr/bin/env bash
# ringzero's one GPU check: build, test, train, measure, in one run of at most 5 minutes on a
# machine with a CUDA GPU (written for an H200: 16 cores, a fresh image with CUDA, a C++
# compiler and python3 but maybe no Meson, doctest or fmt, and no network).
#
#   bench/gpu/device_check.sh              # from anywhere; works on the repository it lives in
#
# Steps, each independent (a failing step never stops the next) and each under its own time
# limit (run_limited) taken from the budget, the most valuable first:
#   1. build with nvcc and the host compiler directly (no Meson), all compilations in parallel:
#      the kernels (cuda/ringzero_cuda.cu: the primitives and the ZeRO step's kernels, which
#      <ringzero/cuda.cuh> registers at start-up), the 'gpu' and 'device-sim' tests, examples 01
#      and 02 with --device cuda (examples/common/cuda_mlp_kernels.cu, cuBLAS), ringzero-plan,
#      ringzero-gpu-bench and ringzero-bench;
#   2. tests: the no-device test, ZeRO on CUDA against the host runtime, with and without CPU
#      offload (test_gpu_zero), and the same over NCCL (test_gpu_zero_nccl, one rank per GPU);
#      the 'device-sim' suite (host stream, plain C++) on the CPU meanwhile;
#   3. example 02 on the GPU, 2 ranks sharing it: --stage 0..3, then DDP (example 01,
#      --compare-ranks 1,2), then --stage 0..3 --offload optimizer (the CPU update ordered against
#      the CUDA communication stream; skipped with a note in a tree whose example 02 or
#      ringzero-plan lacks --offload), then --backend nccl --stage 0..3 (one process, a world of
#      one: NCCL refuses two ranks on one GPU; 1 epoch, the 2-rank runs' step count), then on
#      NCCL stage 3 --precision bfloat16 --offload optimizer with a checkpoint, resumed from it
#      for a second epoch (docs/gpu.md, "ZeRO on GPUs end to end"), and NCCL stage 3 bfloat16
#      with --offload parameters (the shards in pinned host memory); step times
#      and each rank's memory of the 2-rank runs next to ringzero-plan's numbers for the same
#      model, plus the GPU memory nvidia-smi saw (python3 makes the table; targets: the runtime's
#      allocations equal the plan, stage 3 <= 1.2x DDP, offload <= 2x), and at stage 3 the share of
#      gather time hidden behind compute as the runtime timed it on the streams (time_gathers);
#   4. the other 'gpu' tests (stream, DDP, local backend, primitives, the examples' MLP, NCCL);
#   5. ringzero-gpu-bench (copy and primitive bandwidth, all_reduce on 2 and 4 ranks of one GPU);
#   6. ringzero-bench all_reduce on device memory (local backend 2 and 4 ranks, NCCL 1 rank);
#   7. a short table, printed last.
#
# What the machine needs: nvcc (CUDA 12.8 or newer, for C++20), a C++20 host compiler (g++ 11+),
# the CUDA runtime and cuBLAS; NCCL (under the CUDA toolkit, /usr, or the Python package
# nvidia-nccl-cu*) for the NCCL steps. Header-only libraries and data that a bare image lacks
# come from .device-deps (bench/gpu/prepare_device_deps.sh makes it on a machine that has them;
# carry it with the run): doctest, CLI11 + fmt + nlohmann_json, Eigen, zlib.h, xxhash.h (used
# inline), Fashion-MNIST. Steps whose needs are missing are skipped with a note.
#
# Output: everything to the terminal; when $OUT is set, also at most 8 files there (summary.txt,
# build.log, tests.log, train.log, zero.json, gpu_bench.log, collectives.log, bench.json).
# Environment: DEVICE_CHECK_BUDGET (seconds, default 290), DEVICE_CHECK_BUILD (build folder,
# default /tmp/ringzero-device-check), DEVICE_CHECK_DEPS (default <repo>/.device-deps),
# DEVICE_CHECK_BUILD_CAP (seconds for any one compilation, default 150), CXX, NVCC,
# DEVICE_CHECK_TRAIN_DEVICE (cuda; cpu trains on host memory, to check this script without a GPU).
# Exit status: 0 when no step failed and no target was missed (skips allowed).

set -uo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root" || exit 2
t_start=$(date +%s)
budget=${DEVICE_CHECK_BUDGET:-290}
build=${DEVICE_CHECK_BUILD:-/tmp/ringzero-device-check}
deps=${DEVICE_CHECK_DEPS:-$root/.device-deps}
out=${OUT:-$build/out}
mkdir -p "$build/obj" "$build/bin" "$build/run" "$out"
rm -f "$build"/run/*
jobs=$(nproc 2>/dev/null || echo 4)
# A collective or NCCL call that cannot complete fails after this many seconds instead of the
# default 300, so one stuck step cannot eat the whole budget.
export RINGZERO_TIMEOUT=${RINGZERO_TIMEOUT:-30}

summary_rows=()
failures=0
note() { printf '[device_check %4ds] %s\n' "$(( $(date +%s) - t_start ))" "$*"; }
record() {  # record STEP STATUS DETAIL
  summary_rows+=("$1"$'\t'"$2"$'\t'"$3")
  case "$2" in fail|FAIL|MISS|timeout) failures=$((failures + 1)) ;; esac
  note "$1: $2 $3"
}
remaining() { echo $(( budget - ($(date +%s) - t_start) )); }

# run_limited CAP LOG CMD...: runs CMD with a time limit of min(CAP, time left - 20 s), output to
# the terminal and appended to LOG. Returns CMD's status, 124 on timeout, 125 when no time is left.
run_limited() {
  local cap=$1 log=$2
  shift 2
  local left
  left=$(( $(remaining) - 20 ))
  if [ "$left" -lt 10 ]; then
    echo "### skipped (out of time): $*" >> "$log"
    return 125
  fi
  [ "$cap" -gt "$left" ] && cap=$left
  echo "### $(date +%T) (limit ${cap}s) $*" >> "$log"
  timeout --kill-after=10 "$cap" "$@" 2>&1 | tee -a "$log"
  return "${PIPESTATUS[0]}"
}

# ------------------------------------------------------------------ 0. what this machine has
note "repository $root, build in $build, logs in $out, budget ${budget}s, $jobs cores"
gpu_name=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
compute_cap=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d ' .')
if [ -n "$gpu_name" ]; then note "GPU: $gpu_name (compute capability $compute_cap)"; else note "no GPU visible to nvidia-smi"; fi
nvcc=${NVCC:-$(command -v nvcc || true)}
[ -z "$nvcc" ] && [ -x /usr/local/cuda/bin/nvcc ] && nvcc=/usr/local/cuda/bin/nvcc
cxx=${CXX:-$(command -v g++ || command -v c++ || command -v clang++ || true)}
python=$(command -v python3 || true)
cuda_home=""
[ -n "$nvcc" ] && cuda_home=$(dirname "$(dirname "$(readlink -f "$nvcc")")")
cuda_inc=$cuda_home/include
cuda_lib=$cuda_home/lib64
[ -d "$cuda_home/targets/x86_64-linux/lib" ] && [ ! -e "$cuda_lib/libcudart.so" ] && cuda_lib=$cuda_home/targets/x86_64-linux/lib

find_header() {  # find_header RELATIVE_PATH DIRS...: prints the first include dir holding it
  local rel=$1
  shift
  for d in "$@"; do [ -n "$d" ] && [ -f "$d/$rel" ] && { echo "$d"; return 0; }; done
  return 1
}
python_nccl=""
[ -n "$python" ] && python_nccl=$("$python" -c 'import nvidia.nccl as m; print(list(m.__path__)[0])' 2>/dev/null)
nccl_inc=$(find_header nccl.h "$cuda_inc" /usr/include /usr/local/include "${python_nccl:+$python_nccl/include}" || true)
nccl_lib_file=""
for d in "$cuda_lib" /usr/lib/x86_64-linux-gnu /usr/local/lib /usr/lib64 "${python_nccl:+$python_nccl/lib}"; do
  for f in "$d/libnccl.so" "$d/libnccl.so.2"; do
    [ -n "$d" ] && [ -f "$f" ] && [ -z "$nccl_lib_file" ] && nccl_lib_file=$f
  done
done
have_nccl=0
[ -n "$nccl_inc" ] && [ -n "$nccl_lib_file" ] && have_nccl=1
doctest_inc=$(find_header doctest/doctest.h "$deps/include" /usr/include /usr/local/include || true)
bench_inc_ok=1
for h in CLI/CLI.hpp fmt/core.h nlohmann/json.hpp; do
  find_header "$h" "$deps/include" /usr/include /usr/local/include > /dev/null || bench_inc_ok=0
done
data=""
for d in "$deps/data/fashion-mnist" /usr/share/datasets/fashion-mnist; do
  [ -f "$d/train-images-idx3-ubyte.gz" ] && { data=$d; break; }
done
eigen_inc=$(find_header Eigen/Core "$deps/include/eigen3" /usr/include/eigen3 || true)
zlib_inc=$(find_header zlib.h "$deps/include" /usr/include || true)
zlib=""
for f in /usr/lib/x86_64-linux-gnu/libz.so* /lib/x86_64-linux-gnu/libz.so*; do [ -f "$f" ] && { zlib=$f; break; }; done
# The examples' checkpoint code hashes with XXH3: xxhash.h is compiled inline (XXH_INLINE_ALL),
# so no libxxhash is needed.
xxhash_inc=$(find_header xxhash.h "$deps/include" /usr/include /usr/local/include || true)
cublas_lib=""
for f in "$cuda_lib/libcublas.so" "$cuda_lib"/libcublas.so.*; do [ -f "$f" ] && { cublas_lib=$f; break; }; done
mlp_ok=0  # the examples' GPU MLP (its kernels, its test) can be built: Eigen and cuBLAS
[ -f examples/common/cuda_mlp_kernels.cu ] && [ -n "$eigen_inc" ] && [ -n "$cublas_lib" ] && mlp_ok=1
example_skip() {  # example_skip DIR: why the example in DIR cannot be built or run with --device cuda here
  if [ ! -d "$1" ]; then echo "no $1 in this tree"
  elif ! grep -rqs -- '"--device"' "$1"; then echo "$1 has no --device option yet"
  elif [ $bench_inc_ok = 0 ]; then echo "no CLI11/fmt/json headers (carry .device-deps)"
  elif [ -z "$eigen_inc" ] || [ -z "$zlib_inc" ] || [ -z "$zlib" ]; then echo "no Eigen, zlib.h or libz (carry .device-deps)"
  elif [ -z "$xxhash_inc" ]; then echo "no xxhash.h (carry .device-deps)"
  elif [ -z "$cublas_lib" ]; then echo "no cuBLAS under $cuda_lib"
  elif [ ! -f examples/common/cuda_mlp_kernels.cu ]; then echo "no examples/common/cuda_mlp_kernels.cu"
  elif [ -z "$data" ]; then echo "no Fashion-MNIST files (carry .device-deps/data/fashion-mnist)"
  fi
}
ddp_dir=examples/01_ddp_fashion_mnist
zero_dir=examples/02_zero_fashion_mnist
trainer_skip=$(example_skip "$ddp_dir")
zero_skip=$(example_skip "$zero_dir")
# --offload optimizer: example 02 and ringzero-plan must both know it.
offload_skip=""
if ! grep -rqs -- '"--offload"' "$zero_dir"; then offload_skip="example 02 has no --offload option yet"
elif ! grep -qs -- '"--offload"' tools/ringzero_plan.cpp; then offload_skip="ringzero-plan has no --offload option yet"
fi
note "nvcc: ${nvcc:-none}; host compiler: ${cxx:-none}; NCCL: $([ $have_nccl = 1 ] && echo "$nccl_inc, $nccl_lib_file" || echo none); doctest: ${doctest_inc:-none}; CLI11/fmt/json: $([ $bench_inc_ok = 1 ] && echo yes || echo no); python3: ${python:-none}"

# ------------------------------------------------------------------ 1. build
gencode="-gencode=arch=compute_90,code=sm_90 -gencode=arch=compute_90,code=compute_90"
if [ -n "$compute_cap" ] && [ "$compute_cap" != "90" ]; then
  gencode="$gencode -gencode=arch=compute_${compute_cap},code=sm_${compute_cap}"
fi
defs="-DRINGZERO_HAS_CUDA=1"
nccl_link=()
if [ $have_nccl = 1 ]; then
  defs="$defs -DRINGZERO_HAS_NCCL=1"
  nccl_link=("$nccl_lib_file" "-Wl,-rpath,$(dirname "$nccl_lib_file")")
fi
incs="-I$root/include -I$root/bench -I$root/tests/gpu -I$deps/include -isystem $cuda_inc ${nccl_inc:+-isystem $nccl_inc}"
common_flags="-std=c++20 -O3 -DNDEBUG -pthread -DDOCTEST_CONFIG_USE_STD_HEADERS -DFMT_HEADER_ONLY"
cxxflags="$common_flags $defs $incs"
# The device-sim tests need no CUDA: built as the Meson suite builds them (release, full sweep).
simflags="$common_flags -DRINGZERO_TEST_SWEEP_FULL -I$root/include -I$deps/include"
nvccflags="-std=c++20 -O3 -DNDEBUG $gencode --threads 2 -DRINGZERO_HAS_CUDA=1 -I$root/include"
cuda_link=("-L$cuda_lib" -lcudart "-Wl,-rpath,$cuda_lib" -pthread)
build_log=$out/build.log
: > "$build_log"
obj=$build/obj
bin=$build/bin

build_cap=${DEVICE_CHECK_BUILD_CAP:-150}  # seconds for any one compilation (they run in parallel)
compile_nvcc() {  # compile_nvcc SRC OBJ [EXTRA...]
  local src=$1 o=$2 log
  shift 2
  log=$build_log.$(basename "$o")
  # shellcheck disable=SC2086
  timeout --kill-after=5 "$build_cap" "$nvcc" $nvccflags "$@" -c "$src" -o "$o" >> "$log" 2>&1
  local rc=$?
  if [ $rc != 0 ] && grep -q "unsupported GNU version\|unsupported clang version" "$log"; then
    # shellcheck disable=SC2086
    timeout --kill-after=5 "$build_cap" "$nvcc" $nvccflags -allow-unsupported-compiler "$@" -c "$src" -o "$o" >> "$log" 2>&1
    rc=$?
  fi
  return $rc
}
compile_cxx() {  # compile_cxx SRC OBJ [EXTRA...]: EXTRA comes first, so its -I folders are searched first
  local src=$1 o=$2
  shift 2
  # (bench/command_line.hpp must not stand in for examples/common/command_line.hpp)
  # shellcheck disable=SC2086
  timeout --kill-after=5 "$build_cap" "$cxx" "$@" $cxxflags -c "$src" -o "$o" >> "$build_log.$(basename "$o")" 2>&1
}
compile_sim() {  # compile_sim SRC OBJ: a device-sim test (no CUDA)
  # shellcheck disable=SC2086
  timeout --kill-after=5 "$build_cap" "$cxx" $simflags -c "$1" -o "$2" >> "$build_log.$(basename "$2")" 2>&1
}
link() {  # link EXE OBJS...: links with the CUDA runtime (and NCCL) when every object exists
  local exe=$1
  shift
  for o in "$@"; do [ -f "$o" ] || return 1; done
  echo "### link $exe" >> "$build_log"
  "$cxx" -o "$bin/$exe" "$@" "${nccl_link[@]}" "${cuda_link[@]}" >> "$build_log" 2>&1
}
link_host() {  # link_host EXE OBJS...: links a program that needs no CUDA
  local exe=$1
  shift
  for o in "$@"; do [ -f "$o" ] || return 1; done
  echo "### link $exe" >> "$build_log"
  "$cxx" -o "$bin/$exe" "$@" -pthread >> "$build_log" 2>&1
}

built=()
if [ -z "$cxx" ]; then
  record build fail "no C++ compiler on this machine"
else
  [ -z "$nvcc" ] && note "no nvcc: only what needs no CUDA is built"
  note "building with $jobs cores (log: $build_log)"
  build_started=$(date +%s)
  [ "$(remaining)" -lt $((build_cap + 60)) ] && build_cap=$(( $(remaining) - 60 ))
  rm -f "$bin"/* "$obj"/*.o "$obj"/*.rc "$obj"/*.time "$build_log".*
  names=()
  spawn() {  # spawn NAME CMD...: runs CMD in the background, at most $jobs at once; status in NAME.rc
    local name=$1
    shift
    while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n 2>/dev/null || sleep 0.2; done
    names+=("$name")
    ( local t0=$SECONDS rc
      "$@"
      rc=$?
      [ $rc = 124 ] && echo "### killed after DEVICE_CHECK_BUILD_CAP (${build_cap}s)" >> "$build_log.$name"
      echo $rc > "$obj/$name.rc"
      echo $(( SECONDS - t0 )) > "$obj/$name.time" ) &
  }
  example_flags=(-isystem "$eigen_inc" -Iexamples/common -DEIGEN_DONT_PARALLELIZE -DRINGZERO_EXAMPLES_HAVE_CUDA=1 -DXXH_INLINE_ALL)
  # never -isystem /usr/include: it breaks the standard library's #include_next
  [ -n "$zlib_inc" ] && [ "$zlib_inc" != /usr/include ] && example_flags+=(-isystem "$zlib_inc")
  [ -n "$xxhash_inc" ] && [ "$xxhash_inc" != /usr/include ] && example_flags+=(-isystem "$xxhash_inc")
  # The longest compilations first (the kernels, the trainers), then by value.
  if [ -n "$nvcc" ]; then
    spawn ringzero_cuda.o compile_nvcc cuda/ringzero_cuda.cu "$obj/ringzero_cuda.o"
    [ $mlp_ok = 1 ] && spawn cuda_mlp_kernels.o compile_nvcc examples/common/cuda_mlp_kernels.cu "$obj/cuda_mlp_kernels.o" -Iexamples/common
    [ -z "$zero_skip" ] && spawn zero_fashion_mnist.o compile_cxx "$zero_dir/zero_fashion_mnist.cpp" "$obj/zero_fashion_mnist.o" "${example_flags[@]}"
    [ -z "$trainer_skip" ] && spawn ddp_fashion_mnist.o compile_cxx "$ddp_dir/ddp_fashion_mnist.cpp" "$obj/ddp_fashion_mnist.o" "${example_flags[@]}"
  fi
  if [ -n "$doctest_inc" ]; then
    spawn doctest_main.o compile_cxx tests/main.cpp "$obj/doctest_main.o"
    if [ -n "$nvcc" ]; then
      spawn gpu_main.o compile_cxx tests/gpu/gpu_main.cpp "$obj/gpu_main.o"
      [ -f tests/gpu/test_zero_cuda.cpp ] && spawn test_zero_cuda.o compile_cxx tests/gpu/test_zero_cuda.cpp "$obj/test_zero_cuda.o"
      spawn test_no_device.o compile_cxx tests/gpu/test_no_device.cpp "$obj/test_no_device.o" -DRINGZERO_TEST_HAVE_KERNELS=1
    fi
    [ -f tests/zero/test_sharded_model_device.cpp ] && spawn test_zero_device.o compile_sim tests/zero/test_sharded_model_device.cpp "$obj/test_zero_device.o"
    [ -f tests/zero/test_sharded_model_offload.cpp ] && spawn test_zero_offload.o compile_sim tests/zero/test_sharded_model_offload.cpp "$obj/test_zero_offload.o"
    [ -f tests/primitive/test_host_stream.cpp ] && spawn test_host_stream.o compile_sim tests/primitive/test_host_stream.cpp "$obj/test_host_stream.o"
    [ -f tests/primitive/test_memory_ops.cpp ] && spawn test_memory_ops.o compile_sim tests/primitive/test_memory_ops.cpp "$obj/test_memory_ops.o"
    if [ -n "$nvcc" ]; then
      spawn test_primitives.o compile_cxx tests/gpu/test_primitives.cpp "$obj/test_primitives.o"
      spawn test_local_cuda.o compile_cxx tests/gpu/test_local_cuda.cpp "$obj/test_local_cuda.o"
      [ -f tests/gpu/test_ddp_cuda.cpp ] && spawn test_ddp_cuda.o compile_cxx tests/gpu/test_ddp_cuda.cpp "$obj/test_ddp_cuda.o"
      [ -f tests/gpu/test_cuda_stream.cpp ] && spawn test_cuda_stream.o compile_cxx tests/gpu/test_cuda_stream.cpp "$obj/test_cuda_stream.o"
      [ $mlp_ok = 1 ] && [ -f tests/gpu/test_cuda_mlp.cpp ] && spawn test_cuda_mlp.o compile_cxx tests/gpu/test_cuda_mlp.cpp \
        "$obj/test_cuda_mlp.o" -isystem "$eigen_inc" -Iexamples/common -DEIGEN_DONT_PARALLELIZE -DRINGZERO_EXAMPLES_HAVE_CUDA=1
      [ $have_nccl = 1 ] && spawn test_nccl.o compile_cxx tests/gpu/test_nccl.cpp "$obj/test_nccl.o"
      [ $have_nccl = 1 ] && [ -f tests/gpu/test_zero_nccl.cpp ] && spawn test_zero_nccl.o compile_cxx tests/gpu/test_zero_nccl.cpp "$obj/test_zero_nccl.o"
    fi
  fi
  if [ $bench_inc_ok = 1 ]; then
    [ -f tools/ringzero_plan.cpp ] && spawn ringzero_plan.o compile_sim tools/ringzero_plan.cpp "$obj/ringzero_plan.o"
    if [ -n "$nvcc" ]; then
      spawn copy_kernel.o compile_nvcc bench/gpu/copy_kernel.cu "$obj/copy_kernel.o"
      spawn gpu_bench.o compile_cxx bench/gpu/gpu_bench.cpp "$obj/gpu_bench.o"
      [ -f bench/ringzero_bench.cpp ] && spawn ringzero_bench.o compile_cxx bench/ringzero_bench.cpp "$obj/ringzero_bench.o"
    fi
  fi
  wait
  failed=()
  for name in "${names[@]}"; do [ "$(cat "$obj/$name.rc" 2>/dev/null)" = 0 ] || failed+=("$name"); done
  # the compilations' durations, longest first: the build's critical path
  slowest=$(for name in "${names[@]}"; do echo "$(cat "$obj/$name.time" 2>/dev/null || echo 0) $name"; done | sort -rn | head -4 |
    awk '{printf "%s%s %ss", (NR > 1 ? ", " : ""), $2, $1}')
  echo "### compile times (s): $(for name in "${names[@]}"; do printf '%s %s; ' "$name" "$(cat "$obj/$name.time" 2>/dev/null)"; done)" >> "$build_log"
  for f in "$build_log".*; do [ -f "$f" ] && { echo "### ${f#"$build_log".}"; cat "$f"; } >> "$build_log"; done
  rm -f "$build_log".*
  k=$obj/ringzero_cuda.o
  link test_gpu_zero "$obj/gpu_main.o" "$obj/test_zero_cuda.o" "$k" && built+=(test_gpu_zero)
  link_host test_device_sim_streams "$obj/doctest_main.o" "$obj/test_host_stream.o" "$obj/test_memory_ops.o" && built+=(test_device_sim_streams)
  link_host test_zero_device "$obj/doctest_main.o" "$obj/test_zero_device.o" && built+=(test_zero_device)
  link_host test_zero_offload "$obj/doctest_main.o" "$obj/test_zero_offload.o" && built+=(test_zero_offload)
  link_host ringzero-plan "$obj/ringzero_plan.o" && built+=(ringzero-plan)
  link test_cuda_no_device "$obj/doctest_main.o" "$obj/test_no_device.o" "$k" && built+=(test_cuda_no_device)
  link test_gpu_primitives "$obj/gpu_main.o" "$obj/test_primitives.o" "$k" && built+=(test_gpu_primitives)
  link test_gpu_local "$obj/gpu_main.o" "$obj/test_local_cuda.o" "$k" && built+=(test_gpu_local)
  link test_gpu_ddp "$obj/gpu_main.o" "$obj/test_ddp_cuda.o" "$k" && built+=(test_gpu_ddp)
  link test_gpu_cuda_stream "$obj/gpu_main.o" "$obj/test_cuda_stream.o" "$k" && built+=(test_gpu_cuda_stream)
  link test_gpu_cuda_mlp "$obj/gpu_main.o" "$obj/test_cuda_mlp.o" "$obj/cuda_mlp_kernels.o" "$k" "$cublas_lib" && built+=(test_gpu_cuda_mlp)
  [ $have_nccl = 1 ] && link test_gpu_nccl "$obj/gpu_main.o" "$obj/test_nccl.o" "$k" && built+=(test_gpu_nccl)
  [ $have_nccl = 1 ] && link test_gpu_zero_nccl "$obj/gpu_main.o" "$obj/test_zero_nccl.o" "$k" && built+=(test_gpu_zero_nccl)
  for ex in ddp_fashion_mnist zero_fashion_mnist; do
    link "$ex" "$obj/$ex.o" "$obj/cuda_mlp_kernels.o" "$k" "$zlib" "$cublas_lib" && built+=("$ex")
  done
  link ringzero-gpu-bench "$obj/gpu_bench.o" "$obj/copy_kernel.o" "$k" && built+=(ringzero-gpu-bench)
  link ringzero-bench "$obj/ringzero_bench.o" "$k" && built+=(ringzero-bench)
  detail="$(( $(date +%s) - build_started ))s (slowest: $slowest); built: ${built[*]:-nothing}"
  [ ${#failed[@]} -gt 0 ] && detail="$detail; FAILED: ${failed[*]} (see build.log)"
  [ -z "$nvcc" ] && detail="$detail; no nvcc: nothing with CUDA built"
  [ -z "$doctest_inc" ] && detail="$detail; no doctest: tests not built (carry .device-deps)"
  [ $bench_inc_ok = 0 ] && detail="$detail; no CLI11/fmt/json: ringzero-plan, ringzero-bench and the examples not built (carry .device-deps)"
  [ $have_nccl = 0 ] && detail="$detail; no NCCL: NCCL steps skipped"
  if [ ${#failed[@]} -gt 0 ] || [ -z "$nvcc" ]; then record build fail "$detail"; else record build ok "$detail"; fi
fi
has() { [ -x "$bin/$1" ]; }

# ------------------------------------------------------------------ 2. tests
tests_log=$out/tests.log
: > "$tests_log"
test_status() {  # test_status NAME RC LOG: records a doctest executable's result
  local name=$1 rc=$2 log=$3 counts
  counts=$(tac "$log" | grep -m1 "test cases:" | sed 's/\[doctest\] //; s/  */ /g')
  case $rc in
    0) record "test $name" pass "$counts" ;;
    77) record "test $name" skip "no CUDA device" ;;
    124) record "test $name" timeout "after its time limit; see tests.log" ;;
    125) record "test $name" skip "out of time" ;;
    *) record "test $name" fail "status $rc: $counts; see tests.log" ;;
  esac
}
run_test() {  # run_test NAME CAP
  local name=$1 cap=$2
  if ! has "$name"; then record "test $name" skip "not built"; return; fi
  run_limited "$cap" "$tests_log" "$bin/$name"
  test_status "$name" $? "$tests_log"
}
# The device-sim suite (plain C++, the host stream) runs on the CPU while the first GPU tests run;
# it is waited for before the trainers' step times are taken.
sim_names=()
sim_pids=()
sim_start() {  # sim_start LABEL EXE CAP [VAR=VALUE...]: a device-sim test in the background
  local label=$1 exe=$2 cap=$3
  shift 3
  if ! has "$exe"; then record "test $label" skip "not built"; return; fi
  local left=$(( $(remaining) - 20 ))
  [ "$cap" -gt "$left" ] && cap=$left
  if [ "$cap" -lt 10 ]; then record "test $label" skip "out of time"; return; fi
  ( echo "### $(date +%T) (limit ${cap}s) $* $bin/$exe"
    env "$@" timeout --kill-after=10 "$cap" "$bin/$exe" 2>&1
    echo "### status $?" ) > "$build/run/$label.log" &
  sim_names+=("$label")
  sim_pids+=($!)
}
sim_wait() {
  local i log rc
  for i in "${!sim_pids[@]}"; do
    wait "${sim_pids[$i]}"
    log=$build/run/${sim_names[$i]}.log
    cat "$log" >> "$tests_log"
    rc=$(tail -1 "$log" | sed -n 's/^### status //p')
    test_status "${sim_names[$i]}" "${rc:-1}" "$log"
  done
  sim_pids=()
}
sim_start device_sim_streams test_device_sim_streams 60 RINGZERO_TIMEOUT=120
sim_start zero_device_sim test_zero_device 120 RINGZERO_TIMEOUT=120
sim_start zero_device_sim_delayed test_zero_device 150 RINGZERO_TIMEOUT=120 RINGZERO_HOST_STREAM_DELAY_US=50
if [ -f tests/zero/test_sharded_model_offload.cpp ]; then
  sim_start zero_offload_sim test_zero_offload 120 RINGZERO_TIMEOUT=120
  sim_start zero_offload_sim_delayed test_zero_offload 150 RINGZERO_TIMEOUT=120 RINGZERO_HOST_STREAM_DELAY_US=50
fi

run_test test_cuda_no_device 30
if [ -f tests/gpu/test_zero_cuda.cpp ]; then run_test test_gpu_zero 90; fi
if [ -f tests/gpu/test_zero_nccl.cpp ]; then
  if [ $have_nccl = 1 ]; then run_test test_gpu_zero_nccl 60; else record "test test_gpu_zero_nccl" skip "no NCCL on this machine"; fi
fi

# ------------------------------------------------------------------ 3. example 02 on the GPU
train_log=$out/train.log
: > "$train_log"
# cuda; cpu only to check this script on a machine without a GPU (the same steps on host memory)
train_device=${DEVICE_CHECK_TRAIN_DEVICE:-cuda}
# gpu_peak_start / gpu_peak_stop: the most GPU memory nvidia-smi reported in use while a run
# went on, in MiB above what was in use before it (every 100 ms).
smi_pid=""
gpu_peak_start() {
  [ -z "$gpu_name" ] && return
  nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 100 > "$build/run/smi.txt" 2>/dev/null &
  smi_pid=$!
}
gpu_peak_stop() {  # prints the peak above the first reading, in MiB, or nothing
  [ -z "$smi_pid" ] && return
  kill "$smi_pid" 2>/dev/null
  wait "$smi_pid" 2>/dev/null
  smi_pid=""
  awk 'NR == 1 { base = $1 } $1 > peak { peak = $1 } END { if (NR > 1) print peak - base }' "$build/run/smi.txt"
}
zero_runs=()  # stage<TAB>offload<TAB>json<TAB>exit status<TAB>GPU peak MiB, for the table (the 2-rank runs)
zero_rc=0     # the last train_zero's exit status
zero_extra=() # more options for train_zero (its epochs: zero_epochs)
zero_epochs=""
train_zero() {  # train_zero STAGE OFFLOAD(none|optimizer|parameters) [BACKEND(local|nccl)] [LABEL SUFFIX]
  local stage=$1 offload=$2 backend=${3:-local} suffix=${4:-} label json rc peak summary_line args launch ranks cap
  label="example 02 stage $stage"
  args=(--ranks 2 --epochs "${zero_epochs:-2}")
  launch=()
  ranks=2
  cap=45
  json=$build/run/zero_s${stage}_$offload.json
  if [ "$backend" = nccl ]; then
    # One process, a world of one (torchrun's variables, so that no stray launcher variable
    # changes it); 1 epoch is the 2-rank runs' step count (half their global batch).
    label="example 02 nccl stage $stage"
    args=(--backend nccl --epochs "${zero_epochs:-1}")
    launch=(env RANK=0 WORLD_SIZE=1 LOCAL_RANK=0)
    ranks=1
    cap=30
    json=$build/run/zero_nccl_s${stage}.json  # not zero_s*.json: outside the table
  fi
  if [ "$offload" != none ]; then label="$label offload"; args+=(--offload "$offload"); fi
  if [ -n "$suffix" ]; then label="$label $suffix"; json=${json%.json}_${suffix// /_}.json; fi
  args+=(${zero_extra[@]+"${zero_extra[@]}"})
  rm -f "$json"
  gpu_peak_start
  run_limited "$cap" "$train_log" "${launch[@]}" "$bin/zero_fashion_mnist" --device "$train_device" --stage "$stage" \
    --data "$data" --no-progress --min-accuracy 0.75 --json "$json" "${args[@]}"
  rc=$?
  zero_rc=$rc
  peak=$(gpu_peak_stop)
  summary_line=$(tac "$train_log" | grep -m1 "^stage $stage, $ranks rank(s)" | sed 's/^stage [0-9], [0-9]* rank(s), //; s/; [0-9.]* s of training.*//')
  if [ "$backend" = nccl ] && [ $rc = 0 ]; then
    # rank 0's time inside the runtime's calls (example 02's epoch line), and at stage 3 the
    # share of the gather time hidden behind compute as the runtime timed it on the streams
    summary_line="$summary_line; in the runtime: $(tac "$train_log" | grep -m1 "in the runtime: gather" | sed 's/.*in the runtime: //')"
  fi
  case $rc in
    0) record "$label" ok "$summary_line${peak:+; GPU memory +$peak MiB (nvidia-smi)}" ;;
    3) record "$label" fail "below 75% test accuracy: $summary_line" ;;
    124) record "$label" timeout "see train.log" ;;
    125) record "$label" skip "out of time" ;;
    *) if tail -3 "$train_log" | grep -q "no CUDA device"; then record "$label" skip "no CUDA device"
       else record "$label" fail "status $rc: $(tail -1 "$train_log")"; fi ;;
  esac
  [ "$backend" = local ] && [ -z "$suffix" ] && zero_runs+=("$stage"$'\t'"$offload"$'\t'"$json"$'\t'"$rc"$'\t'"${peak:-}")
  return 0
}
if [ -n "$zero_skip" ]; then
  record "example 02" skip "$zero_skip"
elif ! has zero_fashion_mnist; then
  record "example 02" fail "did not build (see build.log)"
else
  sim_wait  # the step times below are taken on otherwise idle cores
  for stage in 0 1 2 3; do train_zero "$stage" none; done
fi
sim_wait

# DDP on the GPU (example 01: 1 rank, then 2 ranks sharing the GPU with the DDP reducer on
# device memory, the same global batch; each must reach 75% test accuracy): the reference for
# example 02's step times.
ddp_json=$build/run/ddp.json
rm -f "$ddp_json"
if [ -n "$trainer_skip" ]; then
  record "example 01 (DDP)" skip "$trainer_skip"
elif ! has ddp_fashion_mnist; then
  record "example 01 (DDP)" fail "did not build (see build.log)"
else
  run_limited 60 "$train_log" "$bin/ddp_fashion_mnist" --device "$train_device" --compare-ranks 1,2 --epochs 2 --data "$data" \
    --no-progress --min-accuracy 0.75 --json "$ddp_json"
  rc=$?
  cmp_line=$(grep "rank(s) vs" "$train_log" | tail -1 | sed "s/; [0-9]*% of the .*//")
  case $rc in
    0) record "example 01 (DDP)" ok "--device $train_device, 2 epochs: $cmp_line" ;;
    3) record "example 01 (DDP)" fail "below 75% test accuracy: $(grep "below --min-accuracy" "$train_log" | tail -1)" ;;
    124) record "example 01 (DDP)" timeout "see train.log" ;;
    125) record "example 01 (DDP)" skip "out of time" ;;
    *) if tail -3 "$train_log" | grep -q "no CUDA device"; then record "example 01 (DDP)" skip "no CUDA device"
       else record "example 01 (DDP)" fail "status $rc: $(tail -1 "$train_log")"; fi ;;
  esac
fi

if [ -z "$zero_skip" ] && has zero_fashion_mnist; then
  if [ -n "$offload_skip" ]; then
    record "example 02 offload" skip "$offload_skip"
  else
    for stage in 0 1 2 3; do train_zero "$stage" optimizer; done
  fi
fi

# Example 02 on NCCL (--backend nccl: one process per GPU, so a world of one here), stages 0-3.
if [ -z "$zero_skip" ] && has zero_fashion_mnist; then
  if [ $have_nccl = 0 ]; then
    record "example 02 nccl" skip "no NCCL on this machine"
  elif ! grep -rqs -- '"nccl"' "$zero_dir" "examples/common/run_ranks.hpp"; then
    record "example 02 nccl" skip "example 02 has no --backend nccl yet"
  elif [ "$train_device" != cuda ]; then
    record "example 02 nccl" skip "--backend nccl needs --device cuda (DEVICE_CHECK_TRAIN_DEVICE=$train_device)"
  else
    for stage in 0 1 2 3; do
      train_zero "$stage" none nccl
      if [ "$zero_rc" = 124 ]; then
        [ "$stage" != 3 ] && record "example 02 nccl" skip "the stages after $stage: stage $stage timed out"
        break
      fi
    done
  fi
fi

# Example 02 end to end as docs/gpu.md runs it ("ZeRO on GPUs end to end"): NCCL from torchrun's
# variables (a world of one), stage 3, bfloat16 parameters and gradients with float32 master
# weights, the optimizer offloaded, a checkpoint after the epoch; then the same resumed from it
# for a second epoch.
if [ -z "$zero_skip" ] && has zero_fashion_mnist && [ $have_nccl = 1 ] && [ "$train_device" = cuda ]; then
  if ! grep -qs -- '"--precision"' "$zero_dir/zero_options.hpp"; then
    record "example 02 bfloat16" skip "example 02 has no --precision option yet"
  else
    ckpt_dir=$build/run/ckpt_bfloat16
    rm -rf "$ckpt_dir"
    zero_extra=(--precision bfloat16 --optimizer adamw --checkpoint "$ckpt_dir")
    train_zero 3 optimizer nccl "bfloat16 checkpoint"
    if [ "$zero_rc" = 0 ]; then
      zero_extra=(--precision bfloat16 --optimizer adamw --resume "$ckpt_dir")
      zero_epochs=2
      train_zero 3 optimizer nccl "bfloat16 resumed"
    fi
    zero_extra=()
    zero_epochs=""
    # Parameter offload: the parameter and gradient shards in pinned host memory, each shard
    # copied into its gather buffer before an in-place all_gather (docs/zero.md).
    if grep -qs -- '"parameters"' "$zero_dir/zero_options.hpp"; then
      zero_extra=(--precision bfloat16 --optimizer adamw)
      train_zero 3 parameters nccl "parameters bfloat16"
      zero_extra=()
    else
      record "example 02 parameter offload" skip "example 02 has no --offload parameters yet"
    fi
  fi
fi

# Step times and memory next to ringzero-plan's numbers for the same model (python3 reads the
# JSON files; the model file lists the MLP's tensors as example 02 registers them).
zero_json=$out/zero.json
: > "$zero_json"
if [ ${#zero_runs[@]} -eq 0 ] || ! ls "$build"/run/zero_s*.json > /dev/null 2>&1; then
  record "example 02 vs plan" skip "example 02 did not run"
elif [ -z "$python" ]; then
  record "example 02 vs plan" skip "no python3 to read the JSON files (the runs' lines are in train.log)"
elif ! has ringzero-plan; then
  record "example 02 vs plan" skip "ringzero-plan not built (needs CLI11, fmt, nlohmann_json)"
else
  printf '%s\n' "${zero_runs[@]}" > "$build/run/zero_runs.tsv"
  rm -f "$build/run/zero_records.tsv"
  run_limited 30 "$train_log" "$python" - "$bin/ringzero-plan" "$build/run/zero_runs.tsv" "$ddp_json" "$zero_json" \
    "$build/run/zero_records.tsv" "$build/run" "$train_device" <<'PY'
"""Example 02's runs (JSON of --json) against ringzero-plan --json for the same model; prints a
table and writes STEP<TAB>STATUS<TAB>DETAIL records for the summary."""
import json, os, subprocess, sys

plan_exe, runs_tsv, ddp_path, out_path, records_path, tmp, device = sys.argv[1:8]
records, plans, runs = [], {}, []


def load(path):
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def plan_for(run, offload):
    """ringzero-plan --json for the run's model, stage, world size, optimizer and alignment."""
    cfg = run["config"]
    widths = cfg["widths"]
    model = []
    for i in range(len(widths) - 1):
        unit = f"fc{i + 1}"
        model.append({"name": unit + ".weight", "shape": [widths[i], widths[i + 1]], "unit": unit})
        model.append({"name": unit + ".bias", "shape": [widths[i + 1]], "unit": unit})
    model_path = os.path.join(tmp, "zero_model.json")
    with open(model_path, "w", encoding="utf-8") as f:
        json.dump(model, f)
    optimizer = cfg["optimizer"]
    if optimizer == "sgd":
        optimizer = "sgd-momentum" if cfg.get("momentum", 0) > 0 else "sgd"
    args = [plan_exe, "--model-file", model_path, "--world-size", str(cfg["ranks"]), "--stage", str(cfg["stage"]),
            "--precision", "fp32", "--optimizer", optimizer, "--alignment", str(cfg["alignment_bytes"]),
            "--accumulation-steps", str(cfg.get("accumulate", 1)),
            "--max-inflight-reductions", str(cfg.get("max_inflight_reductions", 2)), "--json"]
    if not cfg.get("prefetch", True):
        args.append("--no-prefetch")
    if offload != "none":
        args += ["--offload", offload]
    p = subprocess.run(args, capture_output=True, text=True)
    if p.returncode != 0:
        return None, " ".join(args) + ": " + p.stderr.strip()
    return json.loads(p.stdout)["plans"][0], " ".join(args[1:])


def kib(b):
    return f"{b / 1024:.1f}"


with open(runs_tsv, encoding="utf-8") as f:
    for line in f:
        stage, offload, path, rc, peak = (line.rstrip("\n").split("\t") + [""] * 5)[:5]
        runs.append({"stage": int(stage), "offload": offload, "status": int(rc), "gpu_peak_mib": peak,
                     "result": load(path)})

ddp = load(ddp_path)
ddp_step = None
if ddp:
    for r in ddp.get("runs", []):
        if r.get("ranks") == 2 and r.get("epochs"):
            ddp_step = sum(e["train_seconds"] for e in r["epochs"]) / (r["steps_per_epoch"] * len(r["epochs"]))

print(f"\nExample 02 --device {device}, 2 ranks{' sharing one GPU' if device == 'cuda' else ''}: step time (mean over the run; median) and memory per rank")
print("(runtime: sharded_model::memory_in_use() after training, the larger rank; plan: ringzero-plan for the same")
print("model, in all and on the GPU / in host memory; GPU MiB: the most memory nvidia-smi saw in use above the")
print("start, CUDA contexts and cuBLAS included)")
head = f"  {'stage':<6}{'offload':<10}{'ms/step':>9}{'median':>9}{'x DDP':>7}{'acc':>7}{'runtime KiB':>13}" \
       f"{'plan KiB':>10}{'on GPU':>10}{'on host':>10}{'GPU MiB':>9}  memory"
print(head)
memory_ok, memory_checked, table = True, 0, []
for run in runs:
    r = run["result"]
    if r is None or "mean_step_seconds" not in r:
        print(f"  {run['stage']:<6}{run['offload']:<10} no result (exit status {run['status']})")
        continue
    plan, how = plan_for(r, run["offload"])
    measured = max(m["measured"]["total"] for m in r["memory"]) if r.get("memory") else None
    row = {"stage": run["stage"], "offload": run["offload"], "exit_status": run["status"],
           "mean_step_ms": 1e3 * r["mean_step_seconds"], "median_step_ms": 1e3 * r["median_step_seconds"],
           "final_test_accuracy": r.get("final_test_accuracy"), "runtime_memory_bytes": measured,
           "gpu_peak_mib": float(run["gpu_peak_mib"]) if run["gpu_peak_mib"] else None, "ringzero_plan": how}
    if ddp_step:
        row["relative_to_ddp"] = r["mean_step_seconds"] / ddp_step
    if plan is None:
        verdict = "ringzero-plan failed: " + how
        memory_ok = False
    else:
        row["plan_memory"] = plan["memory_per_rank"]
        row["plan_device_memory"] = plan.get("device_memory_per_rank")
        row["plan_host_memory"] = plan.get("host_memory_per_rank")
        same_plan = r["plan"]["memory"]["total"] == plan["memory_per_rank"]["total"]
        equal = measured == plan["memory_per_rank"]["total"]
        memory_checked += 1
        memory_ok = memory_ok and equal and same_plan
        verdict = "= plan" if equal and same_plan else (
            f"differs by {measured - plan['memory_per_rank']['total']:+d} B" if same_plan else
            "example's own plan differs from ringzero-plan's: not the same model?")
    row["memory_verdict"] = verdict
    table.append(row)
    dev = (plan or {}).get("device_memory_per_rank", {}).get("total")
    host = (plan or {}).get("host_memory_per_rank", {}).get("total")
    print(f"  {run['stage']:<6}{run['offload']:<10}{row['mean_step_ms']:>9.3f}{row['median_step_ms']:>9.3f}"
          f"{row.get('relative_to_ddp', float('nan')):>7.2f}{row['final_test_accuracy'] or 0:>7.4f}"
          f"{kib(measured) if measured is not None else '?':>13}"
          f"{kib(plan['memory_per_rank']['total']) if plan else '?':>10}{kib(dev) if dev is not None else '-':>10}"
          f"{kib(host) if host is not None else '-':>10}{run['gpu_peak_mib'] or '-':>9}  {verdict}")
if ddp_step:
    print(f"  DDP (example 01, 2 ranks, --device {device}): {1e3 * ddp_step:.3f} ms/step")
else:
    print("  DDP (example 01, 2 ranks): no result, so no 'x DDP' column")

if not table:
    records.append(("example 02 vs plan", "skip", "no run of example 02 left a result"))
if memory_checked:
    records.append(("example 02 memory = plan", "met" if memory_ok else "MISS",
                    f"{memory_checked} run(s): runtime allocations against ringzero-plan, byte for byte"))


def step(stage, offload):
    for row in table:
        if row["stage"] == stage and row["offload"] == offload and row["exit_status"] == 0:
            return row["mean_step_ms"]
    return None


# Stage 3's gathers as the runtime timed them on the streams (sharded_model_options::time_gathers,
# on in example 02 at stage 3): the share of gather time the compute stream did not wait for.
for row, run in zip(table, [x for x in runs if x["result"] is not None and "mean_step_seconds" in x["result"]]):
    timing = [e.get("gather_timing") for e in run["result"].get("epochs", []) if e.get("gather_timing")]
    if row["stage"] == 3 and timing and timing[-1]["gathers"] > 0:
        t = timing[-1]
        row["gather_timing"] = t
        records.append((f"stage 3 gathers hidden (offload {row['offload']})", "info",
                        f"{100 * t['hidden_fraction']:.0f}% of {t['gather_seconds']:.3f} s of gathers hidden "
                        f"behind compute ({t['exposed_seconds']:.3f} s waited for, last epoch)"))

s3 = step(3, "none")
if s3 is not None and ddp_step:
    ratio = s3 / (1e3 * ddp_step)
    records.append(("stage 3 <= 1.2x DDP", "met" if ratio <= 1.2 else "MISS",
                    f"stage 3 {s3:.3f} ms/step, DDP {1e3 * ddp_step:.3f} ms/step: {ratio:.2f}x"))
ratios = []
for stage in range(4):
    a, b = step(stage, "optimizer"), step(stage, "none")
    if a is not None and b is not None:
        ratios.append((a / b, stage))
if ratios:
    worst = max(ratios)
    records.append(("offload <= 2x no offload", "met" if worst[0] <= 2 else "MISS",
                    ", ".join(f"stage {s} {x:.2f}x" for x, s in ratios)))

with open(out_path, "w", encoding="utf-8") as f:
    json.dump({"runs": table, "ddp_ms_per_step": 1e3 * ddp_step if ddp_step else None,
               "example_02": [run["result"] for run in runs]}, f, indent=1)
with open(records_path, "w", encoding="utf-8") as f:
    for rec in records:
        f.write("\t".join(rec) + "\n")
PY
  rc=$?
  if [ $rc -ne 0 ]; then
    record "example 02 vs plan" fail "status $rc; see train.log"
  elif [ -f "$build/run/zero_records.tsv" ]; then
    while IFS=$'\t' read -r step status detail; do record "$step" "$status" "$detail"; done < "$build/run/zero_records.tsv"
  fi
fi

# ------------------------------------------------------------------ 4. the other GPU tests
run_test test_gpu_cuda_stream 40
run_test test_gpu_ddp 90
run_test test_gpu_local 150
run_test test_gpu_primitives 200
if [ $mlp_ok = 1 ]; then run_test test_gpu_cuda_mlp 40; else record "test test_gpu_cuda_mlp" skip "no Eigen or cuBLAS"; fi
if [ $have_nccl = 1 ]; then run_test test_gpu_nccl 100; else record "test test_gpu_nccl" skip "no NCCL on this machine"; fi

# ------------------------------------------------------------------ 5. copy and primitive bandwidth
gpu_log=$out/gpu_bench.log
bench_json=$out/bench.json  # the JSON documents of ringzero-gpu-bench and of each ringzero-bench run, in turn
: > "$gpu_log"
: > "$bench_json"
if has ringzero-gpu-bench; then
  rm -f "$build/gpu_bench.json"
  run_limited 90 "$gpu_log" "$bin/ringzero-gpu-bench" --size-mib 256 --iters 20 --warmup 3 --ranks 2,4 --json "$build/gpu_bench.json"
  rc=$?
  [ -f "$build/gpu_bench.json" ] && { cat "$build/gpu_bench.json"; echo; } >> "$bench_json"
  copy_line=$(grep -m1 "^# copy bandwidth" "$gpu_log" | sed 's/^# //')
  prim_line=$(grep -m1 "^# target reduce_into" "$gpu_log" | sed 's/^# //')
  ring_line=$(grep -m1 "^# target ring all_reduce" "$gpu_log" | sed 's/^# //')
  errors_line=$(grep -m1 "^# errors" "$gpu_log" | sed 's/^# //')
  case $rc in
    0) record "gpu bench" ok "$copy_line; $errors_line" ;;
    1) record "gpu bench" fail "$errors_line" ;;
    124) record "gpu bench" timeout "see gpu_bench.log" ;;
    125) record "gpu bench" skip "out of time" ;;
    *) if grep -q "no CUDA device" "$gpu_log"; then record "gpu bench" skip "no CUDA device"
       else record "gpu bench" fail "status $rc: $(tail -1 "$gpu_log")"; fi ;;
  esac
  [ -n "$prim_line" ] && record "primitives >= 85% copy" "$(echo "$prim_line" | awk '{print $NF}')" "$prim_line"
  [ -n "$ring_line" ] && record "ring all_reduce <= 2x bound" "$(echo "$ring_line" | awk '{print $NF}')" "$ring_line"
else
  record "gpu bench" skip "ringzero-gpu-bench not built"
fi

# ------------------------------------------------------------------ 6. ringzero-bench on device memory
coll_log=$out/collectives.log
: > "$coll_log"
run_bench() {  # run_bench LABEL CAP ARGS...
  local label=$1 cap=$2
  shift 2
  local json=$build/bench_$$.json
  rm -f "$json"
  run_limited "$cap" "$coll_log" "$bin/ringzero-bench" all_reduce --memory cuda -b 1M -e 256M -f 4 -n 10 -w 2 --json "$json" "$@"
  local rc=$?
  [ -f "$json" ] && { cat "$json"; echo; } >> "$bench_json"
  local busbw errors last
  busbw=$(tac "$coll_log" | grep -m1 "Avg bus bandwidth" | awk '{print $NF}')
  errors=$(tac "$coll_log" | grep -m1 "^# Errors" | sed 's/^# //')
  # the table's columns (bench/harness/table.hpp): 6 time (mean), 8 busbw out of place, 16 %peak
  last=$(tac "$coll_log" | grep -m1 -E "^ +268435456 " | awk '{printf "256 MiB: %s us, busbw %s GB/s, %%peak %s", $6, $8, $16}')
  case $rc in
    0) record "bench $label" ok "avg busbw ${busbw} GB/s; $last; $errors" ;;
    124) record "bench $label" timeout "see collectives.log" ;;
    125) record "bench $label" skip "out of time" ;;
    *) if tail -1 "$coll_log" | grep -q "no CUDA device"; then record "bench $label" skip "no CUDA device"
       else record "bench $label" fail "status $rc: $(tail -1 "$coll_log")"; fi ;;
  esac
}
if has ringzero-bench; then
  for n in 2 4; do
    for algo in ring halving_doubling; do
      run_bench "local $n ranks $algo" 45 --backend local --ranks "$n" --algo "$algo"
    done
  done
  if [ $have_nccl = 1 ]; then
    run_bench "nccl 1 rank native" 40 --backend nccl --ranks 1 --algo native
    run_bench "nccl 1 rank ring" 40 --backend nccl --ranks 1 --algo ring
  else
    record "bench nccl" skip "no NCCL on this machine"
  fi
else
  if [ $bench_inc_ok = 1 ] && [ -n "$nvcc" ]; then record "bench ringzero-bench" fail "did not build (see build.log)"
  else record "bench ringzero-bench" skip "not built: needs nvcc, CLI11, fmt, nlohmann_json (carry .device-deps)"; fi
fi

# ------------------------------------------------------------------ 7. the table
{
  echo
  echo "==== ringzero device check: ${gpu_name:-no GPU}, $(( $(date +%s) - t_start )) s ===="
  for row in "${summary_rows[@]}"; do
    IFS=$'\t' read -r step status detail <<< "$row"
    printf '%-36s %-8s %s\n' "$step" "$status" "$detail"
  done
  echo "==== $( [ $failures = 0 ] && echo "no step failed" || echo "$failures step(s) failed or missed a target") ===="
} | tee "$out/summary.txt"
[ $failures = 0 ]
