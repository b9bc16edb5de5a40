#!/usr/bin/env bash
# ZeRO stage 3 over a slower link on one machine, with and without quantized communication:
# example 04 (examples/04_libtorch_gpt) under mpirun with --backend mpi --link-gbps G (each
# process's sends held back to G Gb/s: docs/mpi.md) and --quantize-weights Q --quantize-gradients Q
# (zero/quantization.hpp), for each process count and width, and prints a Markdown table for
# docs/performance.md: the median step time over the runs' steps, the bytes rank 0 sent per step
# (communicator::traffic, measured), both against the full-precision run, and the mean loss of
# the last 20 steps.
#
# Usage: bench/zero_quantized_link.sh [-B BUILD_DIR (default build-release)] [-g GBPS (1)]
#          [-n "PROCESS COUNTS" ("4")] [-q "WIDTHS" ("none int8 int4")] [-s STEPS (40)]
#          [-b SEQUENCES PER PROCESS AND STEP (4)] [-r RUNS (1)] [-- EXTRA EXAMPLE OPTIONS]
#   e.g. bench/zero_quantized_link.sh -n 2 -s 10   (a quick check)
# Needs mpirun and jq. Prints first which BLAS libtorch loads: the computation's speed (hence how
# much of the link a step hides) depends on it; another one is chosen per run with e.g.
# LD_LIBRARY_PATH=/usr/lib/x86_64-linux-gnu/openblas-serial (Debian's libopenblas0-serial).
# Exit status 0, or 1 on errors.
set -euo pipefail

build=build-release
gbps=1
counts="4"
widths="none int8 int4"
steps=40
per=4
runs=1
while getopts "B:g:n:q:s:b:r:h" opt; do
  case "$opt" in
    B) build=$OPTARG ;;
    g) gbps=$OPTARG ;;
    n) counts=$OPTARG ;;
    q) widths=$OPTARG ;;
    s) steps=$OPTARG ;;
    b) per=$OPTARG ;;
    r) runs=$OPTARG ;;
    h) awk 'NR > 1 && /^#/ { print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    *) exit 1 ;;
  esac
done
shift $((OPTIND - 1))
[ "${1:-}" = "--" ] && shift
extra=("$@")

exe="$build/examples/libtorch_gpt"
[ -x "$exe" ] || { echo "error: $exe not found (build it first: ./scripts/main.sh)" >&2; exit 1; }
command -v jq > /dev/null || { echo "error: jq is needed" >&2; exit 1; }
command -v mpirun > /dev/null || { echo "error: mpirun is needed" >&2; exit 1; }
# Open MPI: more processes than cores, and root in containers.
launch=(mpirun --oversubscribe)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

median() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

# The computation's speed decides how much of the link a step can hide: say which BLAS libtorch's
# matrix products run on (Debian: the reference BLAS unless an optimized one is installed).
blas=$(ldd "$exe" | awk '/libblas\.so/ { print $3; exit }')
echo "libtorch's BLAS: $( [ -n "$blas" ] && readlink -f "$blas" || echo "not found by ldd")"
echo
echo "| processes | quantized | step time (ms), runs | median | vs none | sent per step (KiB) | vs none | loss (last 20 steps) |"
echo "|---|---|---|---|---|---|---|---|"
for np in $counts; do
  base_time="" base_sent=""
  for q in $widths; do
    times="" sent="" loss=""
    for run in $(seq 1 "$runs"); do
      json="$tmp/$np-$q-$run.json"
      "${launch[@]}" -np "$np" "$exe" --backend mpi --link-gbps "$gbps" --strategy zero3 --steps "$steps" \
        --batch "$((per * np))" --generate 0 --print-every 1000 --quantize-weights "$q" --quantize-gradients "$q" \
        --json "$json" ${extra[@]+"${extra[@]}"} > "$tmp/log" 2>&1 ||
        { cat "$tmp/log"; echo "error: $np processes, $q failed" >&2; exit 1; }
      times+=" $(jq -r '.median_step_seconds * 1000' "$json")"
      sent=$(jq -r '.sent_bytes_per_step / 1024' "$json")
      loss=$(jq -r '.losses[-20:] | add / length' "$json")
    done
    med=$(echo "$times" | median)
    if [ "$q" = none ]; then base_time=$med; base_sent=$sent; fi
    list=$(echo "$times" | awk '{ for (i = 1; i <= NF; i++) printf "%s%.1f", (i > 1 ? ", " : ""), $i }')
    vs_time=$([ -n "$base_time" ] && awk -v a="$base_time" -v b="$med" 'BEGIN { printf "%.2fx", a / b }' || echo "")
    vs_sent=$([ -n "$base_sent" ] && awk -v a="$base_sent" -v b="$sent" 'BEGIN { printf "%.2fx", a / b }' || echo "")
    printf "| %s | %s | %s | %.1f | %s | %.1f | %s | %.4f |\n" "$np" "$q" "$list" "$med" "$vs_time" "$sent" "$vs_sent" "$loss"
  done
done
