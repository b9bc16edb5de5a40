#!/usr/bin/env bash
# Benchmark of data-parallel training (examples/01_ddp_fashion_mnist): trains the MLP on
# Fashion-MNIST for 10 epochs on 1 rank and then on 2 ranks with the same global batch, and
# reports
#   - the test accuracy after the last epoch of each run and their difference,
#   - the epoch wall-time speedup of 2 ranks over 1 (per epoch, and total training time),
#   - the fraction of the gradient-reduction time hidden behind backward (the reducer measures,
#     per step, the time from each bucket's launch to its completion, and the time finish()
#     actually waited; hidden = 1 - waited / in flight),
# checks them against the targets (accuracy >= 0.87, within 0.5 points of 1 rank, speedup >= 1.7),
# and prints a Markdown block (command, machine, date, results) for docs/performance.md.
#
# Usage: bench/ddp_fashion_mnist.sh [-B BUILD_DIR (default build-release)] [-e EPOCHS] [-o RESULT.json] [-- EXTRA EXAMPLE OPTIONS]
#   e.g. bench/ddp_fashion_mnist.sh -B build-release
#        bench/ddp_fashion_mnist.sh -e 1 -- --train-subset 6000     (a quick check that it works)
# Exit status: 0 when every target is met, 2 when one is missed, 1 on errors.
# Needs jq for the summary. Run it on an otherwise idle machine: the speedup measures how well two
# ranks share two cores, and any other load skews it.
set -euo pipefail

build=build-release  # the release build that scripts/main.sh makes
epochs=10
json=""
json_option=""  # -o as given, for the printed command
while getopts "B:e:o:h" opt; do
  case "$opt" in
    B) build=$OPTARG ;;
    e) epochs=$OPTARG ;;
    o) json=$OPTARG; json_option=" -o $OPTARG" ;;
    h) awk 'NR > 1 && /^#/ { print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    *) exit 1 ;;
  esac
done
shift $((OPTIND - 1))
[ "${1:-}" = "--" ] && shift

exe="$build/examples/ddp_fashion_mnist"
[ -x "$exe" ] || { echo "error: $exe not found (build it first: ./scripts/main.sh, or ninja -C $build examples/ddp_fashion_mnist)" >&2; exit 1; }
command -v jq > /dev/null || { echo "error: jq is needed for the summary" >&2; exit 1; }
[ -n "$json" ] || json="$build/ddp_fashion_mnist_bench.json"

# The configuration measured (the example's defaults, spelled out): global batch 512 (1 x 512 and
# 2 x 256), SGD with momentum 0.9 and learning rate 0.1, gradients in bucket memory, two buckets
# (fc3 and fc2 are reduced while fc1's gradients are computed), rank threads pinned to cores.
args=(--compare-ranks 1,2 --epochs "$epochs" --global-batch 512 --optimizer sgd --lr 0.1 --bucket-mb 0.1 --no-progress --json "$json" "$@")
echo "+ $exe ${args[*]}"
"$exe" "${args[@]}"

summary=$(jq -r '
  (.runs[0]) as $one | (.runs[1]) as $two | (.comparison[0]) as $c |
  "accuracy_1=\($one.final_test_accuracy)",
  "accuracy_2=\($two.final_test_accuracy)",
  "speedup=\($c.speedup)",
  "hidden=\($c.hidden_fraction)",
  "reduction=\($c.reduction_seconds)",
  "exposed=\($c.exposed_reduction_seconds)",
  "epoch_speedups=\([$c.epoch_speedups[] | (. * 100 | round / 100)] | map(tostring) | join(" ") | @sh)",
  "epochs_1=\([$one.epochs[].train_seconds | (. * 100 | round / 100)] | map(tostring) | join(" ") | @sh)",
  "epochs_2=\([$two.epochs[].train_seconds | (. * 100 | round / 100)] | map(tostring) | join(" ") | @sh)"
' "$json")
eval "$summary"

verdict() { if [ "$1" = 1 ]; then echo "met"; else echo "MISSED"; fi; }
ok_acc=$(jq -n "$accuracy_2 >= 0.87 | if . then 1 else 0 end")
ok_diff=$(jq -n "(($accuracy_2 - $accuracy_1) | fabs) <= 0.005 | if . then 1 else 0 end")
ok_speed=$(jq -n "$speedup >= 1.7 | if . then 1 else 0 end")
pct() { jq -n "$1 * 100 | . * 100 | round / 100"; }

cpu=$(lscpu 2> /dev/null | sed -n 's/^Model name: *//p' | head -1)
cat << MD

### DDP on Fashion-MNIST: 2 ranks vs 1 rank ($epochs epochs)

- command: \`bench/ddp_fashion_mnist.sh -B $build -e $epochs$json_option${*:+ -- $*}\` (runs \`${exe#./} ${args[*]}\`)
- machine: ${cpu:-unknown CPU}, $(nproc) cores, $(uname -sr); date: $(date -u +%Y-%m-%d)

| | 1 rank | 2 ranks | target |
|---|---|---|---|
| test accuracy after epoch $epochs | $accuracy_1 | $accuracy_2 | >= 0.87 on 2 ranks: $(verdict "$ok_acc") |
| accuracy difference (points) | | $(jq -n "($accuracy_2 - $accuracy_1) * 100 | . * 100 | round / 100") | within 0.5: $(verdict "$ok_diff") |
| epoch times (s) | $epochs_1 | $epochs_2 | |
| epoch speedup 2/1 | | $epoch_speedups | |
| training-time speedup 2/1 | | $(jq -n "$speedup * 100 | round / 100")x | >= 1.7x: $(verdict "$ok_speed") |
| gradient reduction in flight / waited for (s) | | $(jq -n "$reduction * 1000 | round / 1000") / $(jq -n "$exposed * 1000 | round / 1000") | |
| reduction hidden behind backward | | $(pct "$hidden")% | |
MD

[ "$ok_acc" = 1 ] && [ "$ok_diff" = 1 ] && [ "$ok_speed" = 1 ] && exit 0
exit 2
