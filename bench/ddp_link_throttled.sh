#!/usr/bin/env bash
# DDP over a slower link on one machine: example 01 (examples/01_ddp_fashion_mnist) under mpirun
# with --backend mpi --link-gbps G (each process's sends held back to G Gb/s: docs/mpi.md), for
# each process count and compression, and prints a Markdown table for docs/performance.md: the
# median step time over the runs (train seconds of one epoch / steps), the bytes rank 0 sent per
# step (communicator::traffic, measured), and both against the uncompressed run.
#
# Usage: bench/ddp_link_throttled.sh [-B BUILD_DIR (default build-release)] [-g GBPS (1)]
#          [-n "PROCESS COUNTS" ("2 4")] [-c "COMPRESSIONS" ("none bf16 powersgd:2 powersgd:8")]
#          [-r RUNS (3)] [-- EXTRA EXAMPLE OPTIONS]
#   e.g. bench/ddp_link_throttled.sh -n 2 -r 1 -- --train-subset 6000   (a quick check)
# One epoch of the whole training set (256 examples per rank and step: 117 steps on 2 processes, 58
# on 4). PowerSGD compresses
# from the first step here (--powersgd-start 0): the epoch measures compressed steps only.
# Needs mpirun and jq. Exit status 0, or 1 on errors.
set -euo pipefail

build=build-release
gbps=1
counts="2 4"
compressions="none bf16 powersgd:2 powersgd:8"
runs=3
while getopts "B:g:n:c:r:h" opt; do
  case "$opt" in
    B) build=$OPTARG ;;
    g) gbps=$OPTARG ;;
    n) counts=$OPTARG ;;
    c) compressions=$OPTARG ;;
    r) runs=$OPTARG ;;
    h) awk 'NR > 1 && /^#/ { print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    *) exit 1 ;;
  esac
done
shift $((OPTIND - 1))
[ "${1:-}" = "--" ] && shift
extra=("$@")

exe="$build/examples/ddp_fashion_mnist"
[ -x "$exe" ] || { echo "error: $exe not found (build it first: ./scripts/main.sh)" >&2; exit 1; }
command -v jq > /dev/null || { echo "error: jq is needed" >&2; exit 1; }
command -v mpirun > /dev/null || { echo "error: mpirun is needed" >&2; exit 1; }
# Open MPI: more processes than cores, and root in containers.
launch=(mpirun --oversubscribe)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

median() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

echo "| processes | compression | step time (ms), runs | median | vs none | sent per step (KiB) | vs none |"
echo "|---|---|---|---|---|---|---|"
for np in $counts; do
  base_time="" base_sent=""
  for compress in $compressions; do
    times=""
    sent=""
    start=()
    [[ $compress == powersgd:* ]] && start=(--powersgd-start 0)
    for run in $(seq 1 "$runs"); do
      json="$tmp/$np-$compress-$run.json"
      "${launch[@]}" -np "$np" "$exe" --backend mpi --link-gbps "$gbps" --epochs 1 --compress "$compress" \
        ${start[@]+"${start[@]}"} --no-progress --json "$json" ${extra[@]+"${extra[@]}"} > "$tmp/log" 2>&1 ||
        { cat "$tmp/log"; echo "error: $np processes, $compress failed" >&2; exit 1; }
      times+=" $(jq -r '.runs[0] | (.epochs[0].train_seconds / .steps_per_epoch * 1000)' "$json")"
      sent=$(jq -r '.runs[0].epochs[0].sent_bytes_per_step / 1024' "$json")
    done
    med=$(echo "$times" | median)
    if [ "$compress" = none ]; then base_time=$med; base_sent=$sent; fi
    list=$(echo "$times" | awk '{ for (i = 1; i <= NF; i++) printf "%s%.2f", (i > 1 ? ", " : ""), $i }')
    vs_time=$([ -n "$base_time" ] && awk -v a="$base_time" -v b="$med" 'BEGIN { printf "%.2fx", a / b }' || echo "")
    vs_sent=$([ -n "$base_sent" ] && awk -v a="$base_sent" -v b="$sent" 'BEGIN { printf "%.1fx", a / b }' || echo "")
    printf "| %s | %s | %s | %.2f | %s | %.1f | %s |\n" "$np" "$compress" "$list" "$med" "$vs_time" "$sent" "$vs_sent"
  done
done
