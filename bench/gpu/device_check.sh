#!/usr/bin/env bash
# ringzero's one GPU check: build, test, measure, in one run of at most 8 minutes on a machine
# with a CUDA GPU (written for an H200: 16 cores, a fresh image with CUDA and a C++ compiler but
# maybe no Meson, doctest or fmt, and no network).
#
#   bench/gpu/device_check.sh              # from anywhere; works on the repository it lives in
#
# Steps, each independent (a failing step never stops the next) and each under a time limit
# taken from the 8-minute budget:
#   1. build with nvcc and the host compiler directly (no Meson needed): the CUDA kernels
#      (cuda/ringzero_cuda.cu), the GPU tests, ringzero-gpu-bench, ringzero-bench and the
#      Fashion-MNIST trainer with --device cuda (its kernels: examples/common/cuda_mlp_kernels.cu;
#      cuBLAS);
#   2. the GPU tests (suite 'gpu': every primitive exactly against the host primitive, the local
#      backend with device memory on 2, 3 and 4 ranks on one GPU, the DDP gradient reducer on
#      device memory against the host reducer bit for bit, the examples' GPU MLP and optimizers
#      against the CPU ones, NCCL with one rank) and the no-device test;
#   3. ringzero-gpu-bench: the card's copy bandwidth (cudaMemcpyAsync and a copy kernel), every
#      primitive's bandwidth at 256 MiB, and ring / halving-doubling all_reduce on 2 and 4 ranks
#      of one GPU against the ring's copy-bandwidth bound;
#   4. ringzero-bench all_reduce on the local backend with device memory (2 and 4 ranks on one
#      GPU, ring and halving_doubling) and on NCCL (1 rank, native and ring);
#   5. the Fashion-MNIST trainer on the GPU (examples/01_ddp_fashion_mnist --device cuda
#      --compare-ranks 1,2 --epochs 2: 1 rank, then 2 ranks sharing the GPU with the DDP reducer
#      on device memory, same global batch; each must reach 75% test accuracy), when this tree
#      has it;
#   6. a short table, printed last.
#
# What the machine needs: nvcc (CUDA 12.8 or newer, for C++20), a C++20 host compiler (g++ 11+),
# the CUDA runtime; NCCL (found under the CUDA toolkit, /usr, or the Python package
# nvidia-nccl-cu*) for the NCCL steps. Header-only libraries and data that a bare image lacks
# come from .device-deps/ (bench/gpu/prepare_device_deps.sh makes it on a machine that has them;
# carry it with the run): doctest (tests), CLI11 + fmt + nlohmann_json (ringzero-bench), Eigen +
# zlib.h + Fashion-MNIST (the trainer). Steps whose needs are missing are skipped with a note.
#
# Output: everything to the terminal; when $OUT is set, also at most 8 files there (summary.txt,
# build.log, tests.log, gpu_bench.log, gpu_bench.json, collectives.log, collectives.json,
# train.log). Environment: DEVICE_CHECK_BUDGET (seconds, default 470),
# DEVICE_CHECK_BUILD (build folder, default /tmp/ringzero-device-check), DEVICE_CHECK_DEPS
# (default <repo>/.device-deps), DEVICE_CHECK_BUILD_CAP (seconds for any one compilation, default
# 200), CXX, NVCC. Exit status: 0 when no step failed (skips allowed).

set -uo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root" || exit 2
t_start=$(date +%s)
budget=${DEVICE_CHECK_BUDGET:-470}
build=${DEVICE_CHECK_BUILD:-/tmp/ringzero-device-check}
deps=${DEVICE_CHECK_DEPS:-$root/.device-deps}
out=${OUT:-$build/out}
mkdir -p "$build/obj" "$build/bin" "$out"
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
[ -n "$gpu_name" ] && note "GPU: $gpu_name (compute capability $compute_cap)" || note "no GPU visible to nvidia-smi"
nvcc=${NVCC:-$(command -v nvcc || true)}
[ -z "$nvcc" ] && [ -x /usr/local/cuda/bin/nvcc ] && nvcc=/usr/local/cuda/bin/nvcc
cxx=${CXX:-$(command -v g++ || command -v c++ || command -v clang++ || true)}
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
python_nccl=$(python3 -c 'import nvidia.nccl as m; print(list(m.__path__)[0])' 2>/dev/null || true)
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
trainer=examples/01_ddp_fashion_mnist/ddp_fashion_mnist.cpp
data=""
for d in "$deps/data/fashion-mnist" /usr/share/datasets/fashion-mnist; do
  [ -f "$d/train-images-idx3-ubyte.gz" ] && { data=$d; break; }
done
eigen_inc=$(find_header Eigen/Core "$deps/include/eigen3" /usr/include/eigen3 || true)
zlib_inc=$(find_header zlib.h "$deps/include" /usr/include || true)
zlib=$(ls /usr/lib/x86_64-linux-gnu/libz.so* /lib/x86_64-linux-gnu/libz.so* 2>/dev/null | head -1)
cublas_lib=""
for f in "$cuda_lib/libcublas.so" "$cuda_lib"/libcublas.so.*; do [ -f "$f" ] && { cublas_lib=$f; break; }; done
mlp_ok=0  # the examples' GPU MLP (its kernels, its test) can be built: Eigen and cuBLAS
[ -f examples/common/cuda_mlp_kernels.cu ] && [ -n "$eigen_inc" ] && [ -n "$cublas_lib" ] && mlp_ok=1
trainer_skip=""  # why the trainer cannot be built or run here, if it cannot
if [ ! -f "$trainer" ]; then trainer_skip="no $trainer in this tree"
elif ! grep -q -- '"--device"' "$trainer"; then trainer_skip="the trainer in this tree has no --device option yet"
elif [ $bench_inc_ok = 0 ]; then trainer_skip="no CLI11/fmt/json headers (carry .device-deps)"
elif [ -z "$eigen_inc" ] || [ -z "$zlib_inc" ] || [ -z "$zlib" ]; then trainer_skip="no Eigen, zlib.h or libz (carry .device-deps)"
elif [ -z "$cublas_lib" ]; then trainer_skip="no cuBLAS under $cuda_lib"
elif [ -z "$data" ]; then trainer_skip="no Fashion-MNIST files (carry .device-deps/data/fashion-mnist)"
fi
note "nvcc: ${nvcc:-none}; host compiler: ${cxx:-none}; NCCL: $([ $have_nccl = 1 ] && echo "$nccl_inc, $nccl_lib_file" || echo none); doctest: ${doctest_inc:-none}; CLI11/fmt/json: $([ $bench_inc_ok = 1 ] && echo yes || echo no)"

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
cxxflags="-std=c++20 -O3 -DNDEBUG -pthread -DDOCTEST_CONFIG_USE_STD_HEADERS -DFMT_HEADER_ONLY $defs $incs"
nvccflags="-std=c++20 -O3 -DNDEBUG $gencode --threads 2 -DRINGZERO_HAS_CUDA=1 -I$root/include"
cuda_link=("-L$cuda_lib" -lcudart "-Wl,-rpath,$cuda_lib" -pthread)
build_log=$out/build.log
: > "$build_log"
obj=$build/obj
bin=$build/bin

build_cap=${DEVICE_CHECK_BUILD_CAP:-200}  # seconds for any one compilation (they run in parallel)
compile_nvcc() {  # compile_nvcc SRC OBJ
  local log
  log=$build_log.$(basename "$2")
  # shellcheck disable=SC2086
  timeout --kill-after=5 "$build_cap" "$nvcc" $nvccflags -c "$1" -o "$2" >> "$log" 2>&1 && return 0
  if grep -q "unsupported GNU version\|unsupported clang version" "$log"; then
    # shellcheck disable=SC2086
    timeout --kill-after=5 "$build_cap" "$nvcc" $nvccflags -allow-unsupported-compiler -c "$1" -o "$2" >> "$log" 2>&1 && return 0
  fi
  return 1
}
compile_cxx() {  # compile_cxx SRC OBJ [EXTRA...]
  local src=$1 o=$2
  shift 2
  # shellcheck disable=SC2086
  timeout --kill-after=5 "$build_cap" "$cxx" $cxxflags "$@" -c "$src" -o "$o" >> "$build_log.$(basename "$o")" 2>&1
}
link() {  # link EXE OBJS...: links with the CUDA runtime (and NCCL) when every object exists
  local exe=$1
  shift
  for o in "$@"; do [ -f "$o" ] || return 1; done
  echo "### link $exe" >> "$build_log"
  "$cxx" -o "$bin/$exe" "$@" "${nccl_link[@]}" "${cuda_link[@]}" >> "$build_log" 2>&1
}

built=()
if [ -z "$nvcc" ] || [ -z "$cxx" ]; then
  record build fail "no nvcc or no C++ compiler on this machine"
else
  note "building with $jobs cores (log: $build_log)"
  build_started=$(date +%s)
  [ "$(remaining)" -lt $((build_cap + 60)) ] && build_cap=$(( $(remaining) - 60 ))
  rm -f "$bin"/* "$obj"/*.o "$obj"/*.rc "$build_log".*
  names=()
  spawn() {  # spawn NAME CMD...: runs CMD in the background, at most $jobs at once; status in NAME.rc
    local name=$1
    shift
    while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n 2>/dev/null || sleep 0.2; done
    names+=("$name")
    ( "$@"; echo $? > "$obj/$name.rc" ) &
  }
  spawn ringzero_cuda.o compile_nvcc cuda/ringzero_cuda.cu "$obj/ringzero_cuda.o"
  spawn copy_kernel.o compile_nvcc bench/gpu/copy_kernel.cu "$obj/copy_kernel.o"
  spawn gpu_bench.o compile_cxx bench/gpu/gpu_bench.cpp "$obj/gpu_bench.o"
  if [ -n "$doctest_inc" ]; then
    spawn gpu_main.o compile_cxx tests/gpu/gpu_main.cpp "$obj/gpu_main.o"
    spawn doctest_main.o compile_cxx tests/main.cpp "$obj/doctest_main.o"
    spawn test_primitives.o compile_cxx tests/gpu/test_primitives.cpp "$obj/test_primitives.o"
    spawn test_local_cuda.o compile_cxx tests/gpu/test_local_cuda.cpp "$obj/test_local_cuda.o"
    [ -f tests/gpu/test_ddp_cuda.cpp ] && spawn test_ddp_cuda.o compile_cxx tests/gpu/test_ddp_cuda.cpp "$obj/test_ddp_cuda.o"
    [ -f tests/gpu/test_cuda_stream.cpp ] && spawn test_cuda_stream.o compile_cxx tests/gpu/test_cuda_stream.cpp "$obj/test_cuda_stream.o"
    spawn test_no_device.o compile_cxx tests/gpu/test_no_device.cpp "$obj/test_no_device.o" -DRINGZERO_TEST_HAVE_KERNELS=1
    [ $have_nccl = 1 ] && spawn test_nccl.o compile_cxx tests/gpu/test_nccl.cpp "$obj/test_nccl.o"
  fi
  if [ $bench_inc_ok = 1 ] && [ -f bench/ringzero_bench.cpp ]; then
    spawn ringzero_bench.o compile_cxx bench/ringzero_bench.cpp "$obj/ringzero_bench.o"
  fi
  trainer_incs=(-isystem "$eigen_inc")
  # never -isystem /usr/include: it breaks the standard library's #include_next
  [ -n "$zlib_inc" ] && [ "$zlib_inc" != /usr/include ] && trainer_incs+=(-isystem "$zlib_inc")
  if [ $mlp_ok = 1 ]; then
    spawn cuda_mlp_kernels.o compile_nvcc examples/common/cuda_mlp_kernels.cu "$obj/cuda_mlp_kernels.o"
    [ -n "$doctest_inc" ] && [ -f tests/gpu/test_cuda_mlp.cpp ] && spawn test_cuda_mlp.o compile_cxx tests/gpu/test_cuda_mlp.cpp \
      "$obj/test_cuda_mlp.o" "${trainer_incs[@]}" -Iexamples/common -DEIGEN_DONT_PARALLELIZE -DRINGZERO_EXAMPLES_HAVE_CUDA=1
  fi
  if [ -z "$trainer_skip" ]; then
    spawn ddp_fashion_mnist.o compile_cxx "$trainer" "$obj/ddp_fashion_mnist.o" "${trainer_incs[@]}" \
      -Iexamples/common -DEIGEN_DONT_PARALLELIZE -DRINGZERO_EXAMPLES_HAVE_CUDA=1
  fi
  wait
  failed=()
  for name in "${names[@]}"; do [ "$(cat "$obj/$name.rc" 2>/dev/null)" = 0 ] || failed+=("$name"); done
  for f in "$build_log".*; do [ -f "$f" ] && { echo "### ${f#"$build_log".}"; cat "$f"; } >> "$build_log"; done
  rm -f "$build_log".*
  link ringzero-gpu-bench "$obj/gpu_bench.o" "$obj/copy_kernel.o" "$obj/ringzero_cuda.o" && built+=(ringzero-gpu-bench)
  link test_gpu_primitives "$obj/gpu_main.o" "$obj/test_primitives.o" "$obj/ringzero_cuda.o" && built+=(test_gpu_primitives)
  link test_gpu_local "$obj/gpu_main.o" "$obj/test_local_cuda.o" "$obj/ringzero_cuda.o" && built+=(test_gpu_local)
  link test_gpu_ddp "$obj/gpu_main.o" "$obj/test_ddp_cuda.o" "$obj/ringzero_cuda.o" && built+=(test_gpu_ddp)
  [ -f "$obj/test_cuda_stream.o" ] && link test_gpu_cuda_stream "$obj/gpu_main.o" "$obj/test_cuda_stream.o" "$obj/ringzero_cuda.o" &&
    built+=(test_gpu_cuda_stream)
  if [ -f "$obj/test_cuda_mlp.o" ] && [ -f "$obj/cuda_mlp_kernels.o" ]; then
    link test_gpu_cuda_mlp "$obj/gpu_main.o" "$obj/test_cuda_mlp.o" "$obj/cuda_mlp_kernels.o" "$obj/ringzero_cuda.o" "$cublas_lib" &&
      built+=(test_gpu_cuda_mlp)
  fi
  if [ -z "$trainer_skip" ] && [ -f "$obj/ddp_fashion_mnist.o" ] && [ -f "$obj/cuda_mlp_kernels.o" ] && [ -f "$obj/ringzero_cuda.o" ]; then
    echo "### link ddp_fashion_mnist" >> "$build_log"
    "$cxx" -o "$bin/ddp_fashion_mnist" "$obj/ddp_fashion_mnist.o" "$obj/cuda_mlp_kernels.o" "$obj/ringzero_cuda.o" "$zlib" \
      "$cublas_lib" "${nccl_link[@]}" "${cuda_link[@]}" >> "$build_log" 2>&1 && built+=(ddp_fashion_mnist)
  fi
  link test_cuda_no_device "$obj/doctest_main.o" "$obj/test_no_device.o" "$obj/ringzero_cuda.o" && built+=(test_cuda_no_device)
  [ $have_nccl = 1 ] && link test_gpu_nccl "$obj/gpu_main.o" "$obj/test_nccl.o" "$obj/ringzero_cuda.o" && built+=(test_gpu_nccl)
  link ringzero-bench "$obj/ringzero_bench.o" "$obj/ringzero_cuda.o" && built+=(ringzero-bench)
  detail="$(( $(date +%s) - build_started ))s; built: ${built[*]:-nothing}"
  [ ${#failed[@]} -gt 0 ] && detail="$detail; FAILED: ${failed[*]} (see build.log)"
  [ -z "$doctest_inc" ] && detail="$detail; no doctest: tests not built (carry .device-deps)"
  [ $bench_inc_ok = 0 ] && detail="$detail; no CLI11/fmt/json: ringzero-bench not built (carry .device-deps)"
  [ $have_nccl = 0 ] && detail="$detail; no NCCL: NCCL steps skipped"
  if [ ${#failed[@]} -gt 0 ]; then record build fail "$detail"; else record build ok "$detail"; fi
fi
has() { [ -x "$bin/$1" ]; }

# ------------------------------------------------------------------ 2. tests
tests_log=$out/tests.log
: > "$tests_log"
run_test() {  # run_test NAME CAP
  local name=$1 cap=$2
  if ! has "$name"; then record "test $name" skip "not built"; return; fi
  run_limited "$cap" "$tests_log" "$bin/$name"
  local rc=$?
  local counts
  counts=$(tac "$tests_log" | grep -m1 "test cases:" | sed 's/\[doctest\] //; s/  */ /g')
  case $rc in
    0) record "test $name" pass "$counts" ;;
    77) record "test $name" skip "no CUDA device" ;;
    124) record "test $name" timeout "after its time limit; see tests.log" ;;
    125) record "test $name" skip "out of time" ;;
    *) record "test $name" fail "status $rc: $counts; see tests.log" ;;
  esac
}
run_test test_cuda_no_device 30
run_test test_gpu_primitives 200
run_test test_gpu_local 150
if [ -f tests/gpu/test_ddp_cuda.cpp ]; then run_test test_gpu_ddp 90; fi
if [ -f tests/gpu/test_cuda_stream.cpp ]; then run_test test_gpu_cuda_stream 40; fi
if [ $mlp_ok = 1 ]; then run_test test_gpu_cuda_mlp 40; else record "test test_gpu_cuda_mlp" skip "no Eigen or cuBLAS"; fi
if [ $have_nccl = 1 ]; then run_test test_gpu_nccl 100; else record "test test_gpu_nccl" skip "no NCCL on this machine"; fi

# ------------------------------------------------------------------ 3. copy and primitive bandwidth
gpu_log=$out/gpu_bench.log
: > "$gpu_log"
if has ringzero-gpu-bench; then
  run_limited 90 "$gpu_log" "$bin/ringzero-gpu-bench" --size-mib 256 --iters 20 --warmup 3 --ranks 2,4 --json "$out/gpu_bench.json"
  rc=$?
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

# ------------------------------------------------------------------ 4. ringzero-bench on device memory
coll_log=$out/collectives.log
coll_json=$out/collectives.json
: > "$coll_log"
: > "$coll_json"
run_bench() {  # run_bench LABEL CAP ARGS...
  local label=$1 cap=$2
  shift 2
  local json=$build/bench_$$.json
  rm -f "$json"
  run_limited "$cap" "$coll_log" "$bin/ringzero-bench" all_reduce --memory cuda -b 1M -e 256M -f 4 -n 10 -w 2 --json "$json" "$@"
  local rc=$?
  [ -f "$json" ] && { cat "$json"; echo; } >> "$coll_json"
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
  if [ $bench_inc_ok = 1 ]; then record "bench ringzero-bench" fail "did not build (see build.log)"
  else record "bench ringzero-bench" skip "not built: needs CLI11, fmt, nlohmann_json (carry .device-deps)"; fi
fi

# ------------------------------------------------------------------ 5. Fashion-MNIST trainer on the GPU
train_log=$out/train.log
: > "$train_log"
if [ -n "$trainer_skip" ]; then
  record "train fashion-mnist" skip "$trainer_skip"
elif ! has ddp_fashion_mnist; then
  record "train fashion-mnist" fail "did not build (see build.log)"
else
  # 1 rank, then 2 ranks sharing the GPU (the DDP reducer on device memory, local backend), with
  # the same global batch of 512; each run must reach 75% test accuracy (exit status 3 below).
  run_limited 150 "$train_log" "$bin/ddp_fashion_mnist" --device cuda --compare-ranks 1,2 --epochs 2 --data "$data" \
    --no-progress --min-accuracy 0.75 --json "$build/train.json"
  rc=$?
  cmp_line=$(grep -m1 "rank(s) vs" "$train_log" | sed "s/; [0-9]*% of the .*//")
  case $rc in
    0) record "train fashion-mnist" ok "--device cuda, 2 epochs: $cmp_line" ;;
    3) record "train fashion-mnist" fail "below 75% test accuracy: $(grep -m1 "below --min-accuracy" "$train_log")" ;;
    124) record "train fashion-mnist" timeout "see train.log" ;;
    125) record "train fashion-mnist" skip "out of time" ;;
    *) if grep -q "no CUDA device" "$train_log"; then record "train fashion-mnist" skip "no CUDA device"
       else record "train fashion-mnist" fail "status $rc: $(tail -1 "$train_log")"; fi ;;
  esac
fi

# ------------------------------------------------------------------ 6. the table
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
