#!/usr/bin/env bash
# Fine-tuning with a frozen backbone against full fine-tuning, side by side: example 04
# (examples/04_libtorch_gpt) at ZeRO stage 3 with --lora R for each rank R given (0: every
# parameter trains), the frozen backbone kept gathered (--keep-frozen all, the example's
# default). Prints a Markdown table for docs/performance.md: the median step time, the bytes rank
# 0 sent per step (communicator::traffic, measured) and the runtime's memory per rank (the
# plan's categories, measured by sharded_model::memory_in_use), each against full fine-tuning,
# the trainable parameters and the mean loss of the last 20 steps. The runs alternate (R1, R2, ...,
# R1, R2, ...) so that a busy moment of the machine does not fall on one of them.
#
# Usage: bench/zero_lora.sh [-B BUILD_DIR (default build-release)] [-l "LORA RANKS" ("0 8")]
#          [-n RANKS (2)] [-g GBPS (0: the local backend's threads; else mpirun --backend mpi
#          --link-gbps GBPS)] [-s STEPS (40)] [-b SEQUENCES PER RANK AND STEP (4)] [-r RUNS (3)]
#          [-- EXTRA EXAMPLE OPTIONS]
#   e.g. bench/zero_lora.sh -s 10 -r 1   (a quick check)
# Needs jq (and mpirun with -g). Exit status 0, or 1 on errors.
set -euo pipefail

build=build-release
loras="0 8"
ranks=2
gbps=0
steps=40
per=4
runs=3
while getopts "B:l:n:g:s:b:r:h" opt; do
  case "$opt" in
    B) build=$OPTARG ;;
    l) loras=$OPTARG ;;
    n) ranks=$OPTARG ;;
    g) gbps=$OPTARG ;;
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
if [ "$gbps" = 0 ]; then
  launch=("$exe" --ranks "$ranks")
else
  command -v mpirun > /dev/null || { echo "error: mpirun is needed for -g" >&2; exit 1; }
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  launch=(mpirun --oversubscribe -np "$ranks" "$exe" --backend mpi --link-gbps "$gbps")
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

median() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

for run in $(seq 1 "$runs"); do
  for r in $loras; do
    "${launch[@]}" --strategy zero3 --lora "$r" --steps "$steps" --batch "$((per * ranks))" --generate 0 \
      --print-every 1000 --json "$tmp/$r-$run.json" ${extra[@]+"${extra[@]}"} > "$tmp/log" 2>&1 ||
      { cat "$tmp/log"; echo "error: --lora $r failed" >&2; exit 1; }
  done
done

echo "| LoRA rank | trainable parameters | step time (ms), runs | median | vs full | sent per step (KiB) | vs full | memory per rank (KiB) | vs full | loss (last 20 steps) |"
echo "|---|---|---|---|---|---|---|---|---|---|"
base_time="" base_sent="" base_memory=""
for r in $loras; do
  times=""
  for run in $(seq 1 "$runs"); do times+=" $(jq -r '.median_step_seconds * 1000' "$tmp/$r-$run.json")"; done
  json="$tmp/$r-1.json"
  med=$(echo "$times" | median)
  sent=$(jq -r '.sent_bytes_per_step / 1024' "$json")
  memory=$(jq -r '.memory_measured | (.parameters + .gradients + .master_weights + .optimizer_states + .communication_buffers) / 1024' "$json")
  trainable=$(jq -r '"\(.trainable_parameters) of \(.parameters_total)"' "$json")
  loss=$(jq -r '.losses[-20:] | add / length' "$json")
  if [ -z "$base_time" ]; then base_time=$med; base_sent=$sent; base_memory=$memory; fi
  list=$(echo "$times" | awk '{ for (i = 1; i <= NF; i++) printf "%s%.1f", (i > 1 ? ", " : ""), $i }')
  ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2fx", a / b }'; }
  printf "| %s | %s | %s | %.1f | %s | %.1f | %s | %.1f | %s | %.4f |\n" "$r" "$trainable" "$list" "$med" \
    "$(ratio "$base_time" "$med")" "$sent" "$(ratio "$base_sent" "$sent")" "$memory" "$(ratio "$base_memory" "$memory")" "$loss"
done
