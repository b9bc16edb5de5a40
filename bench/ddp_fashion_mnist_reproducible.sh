#!/usr/bin/env bash
# Cost of reproducible gradient accumulation in the data-parallel trainer
# (examples/01_ddp_fashion_mnist): the epoch time of the default reduction against
# --reproducible, on the same ranks with the same micro-batch split (--micro-batch: every global
# batch cut into micro-batches, micro-batch j on rank j mod n), side by side in one run. The two
# modes alternate (default, reproducible, default, ...) for RUNS rounds, so that drifting load
# affects both alike; each run trains EPOCHS epochs, and the figure per mode is the median over
# runs of each run's median epoch time. The reducer's reduction time per epoch (in flight, and
# waited for by finish(); with several micro-batches per rank the reproducible reductions start as each
# bucket's last deposit is done and overlap the rest of that backward, as the default's do)
# shows how much of the difference is communication and how much the deposits. Checks the ratio
# against the target (reproducible at most 1.3x the default) and prints a Markdown block
# (command, machine, date, results) for docs/performance.md.
#
# Usage: bench/ddp_fashion_mnist_reproducible.sh [-B BUILD_DIR (default build-release)] [-r RANKS (2)]
#          [-m MICRO_BATCH (256)] [-g GLOBAL_BATCH (512)] [-n RUNS (3)] [-e EPOCHS (1)] [-- EXTRA EXAMPLE OPTIONS]
#   e.g. bench/ddp_fashion_mnist_reproducible.sh -m 32          (16 micro-batches of 32 per step)
#        bench/ddp_fashion_mnist_reproducible.sh -n 1 -- --train-subset 6000   (a quick check that it works)
# Exit status: 0 when the target is met, 2 when it is missed, 1 on errors.
# Needs jq. Run it on an otherwise idle machine.
set -euo pipefail

build=build-release
ranks=2
micro=256
global=512
runs=3
epochs=1
while getopts "B:r:m:g:n:e:h" opt; do
  case "$opt" in
    B) build=$OPTARG ;;
    r) ranks=$OPTARG ;;
    m) micro=$OPTARG ;;
    g) global=$OPTARG ;;
    n) runs=$OPTARG ;;
    e) epochs=$OPTARG ;;
    h) awk 'NR > 1 && /^#/ { print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    *) exit 1 ;;
  esac
done
shift $((OPTIND - 1))
[ "${1:-}" = "--" ] && shift

exe="$build/examples/ddp_fashion_mnist"
[ -x "$exe" ] || { echo "error: $exe not found (build it first: ninja -C $build examples/ddp_fashion_mnist)" >&2; exit 1; }
command -v jq > /dev/null || { echo "error: jq is needed for the summary" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# The example's defaults otherwise: SGD with momentum 0.9, learning rate 0.1, gradients in bucket
# memory, two buckets, rank threads pinned to cores.
args=(--ranks "$ranks" --micro-batch "$micro" --global-batch "$global" --epochs "$epochs" --optimizer sgd --lr 0.1
      --bucket-mb 0.1 --no-progress "$@")
median() { jq -s 'sort | if length % 2 == 1 then .[length / 2 | floor] else (.[length / 2 - 1] + .[length / 2]) / 2 end'; }
declare -A times=([default]="" [reproducible]="")
declare -A crcs=([default]="" [reproducible]="")
declare -A reduce=([default]="" [reproducible]="")  # per run: median epoch's reduction in flight / waited for
for ((i = 1; i <= runs; ++i)); do
  for mode in default reproducible; do
    extra=()
    [ "$mode" = reproducible ] && extra=(--reproducible)
    echo "+ $exe ${args[*]} ${extra[*]} --json $tmp/$mode-$i.json" >&2
    "$exe" "${args[@]}" "${extra[@]}" --json "$tmp/$mode-$i.json" > "$tmp/$mode-$i.log"
    t=$(jq '[.runs[0].epochs[].train_seconds]' "$tmp/$mode-$i.json" | jq '.[]' | median)
    times[$mode]+="$t "
    crcs[$mode]+="$(jq -r '.runs[0].parameter_crc32' "$tmp/$mode-$i.json") "
    inflight=$(jq '.runs[0].epochs[].reduction_seconds' "$tmp/$mode-$i.json" | median)
    waited=$(jq '.runs[0].epochs[].exposed_reduction_seconds' "$tmp/$mode-$i.json" | median)
    reduce[$mode]+="$(jq -n "$inflight * 100 | round / 100")/$(jq -n "$waited * 100 | round / 100") "
    echo "  run $i, $mode: median epoch $t s" >&2
  done
done
med_default=$(echo "${times[default]}" | tr ' ' '\n' | grep . | median)
med_repro=$(echo "${times[reproducible]}" | tr ' ' '\n' | grep . | median)
ratio=$(jq -n "$med_repro / $med_default")
ok=$(jq -n "$ratio <= 1.3 | if . then 1 else 0 end")
r3() { jq -n "$1 * 1000 | round / 1000"; }
list() { for t in $1; do printf '%s ' "$(r3 "$t")"; done; }
steps=$(jq '.runs[0].steps_per_epoch' "$tmp/default-1.json")
accum=$(jq '.runs[0].accumulate' "$tmp/default-1.json")

cpu=$(lscpu 2> /dev/null | sed -n 's/^Model name: *//p' | head -1)
cat << MD

### DDP on Fashion-MNIST: reproducible gradient accumulation vs the default ($ranks ranks, micro-batch $micro)

- command: \`bench/ddp_fashion_mnist_reproducible.sh -B $build -r $ranks -m $micro -g $global -n $runs -e $epochs${*:+ -- $*}\`
  (runs \`${exe#./} ${args[*]}\`, alternately without and with \`--reproducible\`)
- machine: ${cpu:-unknown CPU}, $(nproc) cores, $(uname -sr); date: $(date -u +%Y-%m-%d)
- split: global batch $global = $((global / micro)) micro-batches of $micro, $accum per rank and step, $steps steps per epoch

| | default | --reproducible |
|---|---|---|
| median epoch time per run (s) | $(list "${times[default]}")| $(list "${times[reproducible]}")|
| median over runs (s) | $(r3 "$med_default") | $(r3 "$med_repro") |
| gradient reduction per epoch, in flight / waited for (s), per run | ${reduce[default]}| ${reduce[reproducible]}|
| final parameters' CRC-32 per run | ${crcs[default]}| ${crcs[reproducible]}|
| epoch time, reproducible / default | | $(jq -n "$ratio * 100 | round / 100")x (target <= 1.3x: $(if [ "$ok" = 1 ]; then echo met; else echo MISSED; fi)) |
MD

[ "$ok" = 1 ] && exit 0
exit 2
