#!/usr/bin/env bash
# Gradient accumulation at ZeRO stage 3 without traffic, side by side: example 04
# (examples/04_libtorch_gpt) with 4 micro-batches per step in three ways, against one micro-batch
# per step of the same size:
#   one      --accumulation-steps 1 (the baseline: one micro-batch's traffic)
#   every    --accumulation-steps 4: every micro-batch gathers and reduce_scatters
#   no_sync  + --accumulate-unsharded: the first 3 under no_sync(), one reduce_scatter per step
#   kept     + --no-reshard-after-forward --no-reshard-after-backward: units stay gathered across
#            the micro-batches, so a step gathers once too
# Prints a Markdown table for docs/performance.md: the median step time, the bytes rank 0 sent
# per step (communicator::traffic, measured) against one micro-batch's, the runtime's memory per
# rank (sharded_model::memory_in_use at the end of the run: gather buffers included) and the mean
# loss of the last 10 steps. The runs alternate so a busy moment falls on none of them alone.
#
# Usage: bench/zero_accumulation.sh [-B BUILD_DIR (default build-release)] [-n RANKS (2)]
#          [-s STEPS (30)] [-m SEQUENCES PER MICRO-BATCH AND RANK (2)] [-r RUNS (3)]
#          [-- EXTRA EXAMPLE OPTIONS]
# Needs jq. Exit status 0, or 1 on errors.
set -euo pipefail

build=build-release
ranks=2
steps=30
micro=2
runs=3
while getopts "B:n:s:m:r:h" opt; do
  case "$opt" in
    B) build=$OPTARG ;;
    n) ranks=$OPTARG ;;
    s) steps=$OPTARG ;;
    m) micro=$OPTARG ;;
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
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

median() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
modes="one every no_sync kept"
flags() {
  case "$1" in
    one) echo "--accumulation-steps 1 --batch $((micro * ranks))" ;;
    every) echo "--accumulation-steps 4 --batch $((4 * micro * ranks))" ;;
    no_sync) echo "--accumulation-steps 4 --batch $((4 * micro * ranks)) --accumulate-unsharded" ;;
    kept) echo "--accumulation-steps 4 --batch $((4 * micro * ranks)) --accumulate-unsharded --no-reshard-after-forward --no-reshard-after-backward" ;;
  esac
}

for run in $(seq 1 "$runs"); do
  for m in $modes; do
    # shellcheck disable=SC2046
    "$exe" --ranks "$ranks" --strategy zero3 $(flags "$m") --steps "$steps" --generate 0 --print-every 1000 \
      --json "$tmp/$m-$run.json" ${extra[@]+"${extra[@]}"} > "$tmp/log" 2>&1 ||
      { cat "$tmp/log"; echo "error: $m failed" >&2; exit 1; }
  done
done

echo "| way | micro-batches per step | step time (ms), runs | median | sent per step (KiB) | vs one micro-batch | memory per rank (KiB) | loss (last 10 steps) |"
echo "|---|---|---|---|---|---|---|---|"
base_sent=""
for m in $modes; do
  times=""
  for run in $(seq 1 "$runs"); do times+=" $(jq -r '.median_step_seconds * 1000' "$tmp/$m-$run.json")"; done
  json="$tmp/$m-1.json"
  med=$(echo "$times" | median)
  sent=$(jq -r '.sent_bytes_per_step / 1024' "$json")
  memory=$(jq -r '.memory_measured | (.parameters + .gradients + .master_weights + .optimizer_states + .communication_buffers) / 1024' "$json")
  loss=$(jq -r '.losses[-10:] | add / length' "$json")
  count=$(jq -r '.accumulation_steps' "$json")
  [ -z "$base_sent" ] && base_sent=$sent
  list=$(echo "$times" | awk '{ for (i = 1; i <= NF; i++) printf "%s%.1f", (i > 1 ? ", " : ""), $i }')
  printf "| %s | %s | %s | %.1f | %.1f | %s | %.1f | %.4f |\n" "$m" "$count" "$list" "$med" "$sent" \
    "$(awk -v a="$sent" -v b="$base_sent" 'BEGIN { printf "%.3fx", a / b }')" "$memory" "$loss"
done
