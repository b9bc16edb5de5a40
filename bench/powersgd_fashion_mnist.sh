#!/usr/bin/env bash
# PowerSGD on example 01 (examples/01_ddp_fashion_mnist, --compress powersgd:R): trains the MLP on
# Fashion-MNIST on 2 ranks, uncompressed and with each PowerSGD rank given, for each seed, and
# prints a Markdown table for docs/performance.md: final test accuracy per seed, the median and its
# difference from the uncompressed median, and the elements each step sends (the whole model and
# fc1.weight) with the factor saved.
#
# Usage: bench/powersgd_fashion_mnist.sh [-B BUILD_DIR (default build-release)] [-e EPOCHS (10)]
#          [-r "RANKS" (default "2 4 8")] [-s "SEEDS" (default "1 2 3")] [-- EXTRA EXAMPLE OPTIONS]
#   e.g. bench/powersgd_fashion_mnist.sh -r 2 -s 1 -e 1 -- --train-subset 6000   (a quick check)
# The example's own default start applies (--powersgd-start 100: plain all_reduce for the first
# 100 steps, about a tenth of the 10-epoch run); pass --powersgd-start N after -- to change it.
# Needs jq. Exit status 0, or 1 on errors.
set -euo pipefail

build=build-release
epochs=10
ranks="2 4 8"
seeds="1 2 3"
while getopts "B:e:r:s:h" opt; do
  case "$opt" in
    B) build=$OPTARG ;;
    e) epochs=$OPTARG ;;
    r) ranks=$OPTARG ;;
    s) seeds=$OPTARG ;;
    h) awk 'NR > 1 && /^#/ { print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    *) exit 1 ;;
  esac
done
shift $((OPTIND - 1))
[ "${1:-}" = "--" ] && shift

exe="$build/examples/ddp_fashion_mnist"
[ -x "$exe" ] || { echo "error: $exe not found (build it first: ./scripts/main.sh)" >&2; exit 1; }
command -v jq > /dev/null || { echo "error: jq is needed" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

median() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

rows=()
base_median=""
for compress in none $(for r in $ranks; do echo "powersgd:$r"; done); do
  accuracies=""
  sent="" full="" fc1=""
  for seed in $seeds; do
    json="$tmp/$compress-$seed.json"
    "$exe" --ranks 2 --epochs "$epochs" --seed "$seed" --compress "$compress" --no-progress --json "$json" "$@" > "$tmp/log" 2>&1 ||
      { cat "$tmp/log"; echo "error: $compress, seed $seed failed" >&2; exit 1; }
    accuracies+=" $(jq -r '.runs[0].final_test_accuracy' "$json")"
    if [ "$compress" != none ]; then
      sent=$(jq -r '.runs[0].powersgd.sent_elements_per_step' "$json")
      full=$(jq -r '.runs[0].powersgd.uncompressed_elements_per_step' "$json")
      fc1=$(jq -r '.runs[0].powersgd.parameters["fc1.weight"] | "\(.uncompressed) -> \(.sent)"' "$json")
    fi
  done
  med=$(echo "$accuracies" | median)
  if [ "$compress" = none ]; then
    base_median=$med
    rows+=("| none | ${accuracies# } | $med | | 235146 | |")
  else
    diff=$(awk -v a="$med" -v b="$base_median" 'BEGIN { printf "%+.2f", 100 * (a - b) }')
    factor=$(awk -v s="$sent" -v f="$full" 'BEGIN { printf "%.1fx", f / s }')
    rows+=("| $compress | ${accuracies# } | $med | $diff | $sent ($factor) | $fc1 |")
  fi
done

echo
echo "Command: bench/powersgd_fashion_mnist.sh -e $epochs -r \"$ranks\" -s \"$seeds\"${*:+ -- $*}"
echo "Machine: $(nproc) cores, $(awk -F': ' '/model name/ { print $2; exit }' /proc/cpuinfo); date: $(date -u +%Y-%m-%d)"
echo
echo "| --compress | test accuracy per seed | median | vs none (points) | elements per step | fc1.weight per step |"
echo "|---|---|---|---|---|---|"
printf '%s\n' "${rows[@]}"
