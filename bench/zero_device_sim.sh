#!/usr/bin/env bash
# Benchmark of ZeRO training on the simulated device (examples/02_zero_fashion_mnist --device sim:
# the runtime's device path on asynchronous host streams, as CI runs it without a GPU) against
# data parallelism (examples/01_ddp_fashion_mnist), and of CPU offload (--offload optimizer) there.
# Fashion-MNIST, 2 ranks, the six-layer MLP 784-512-512-256-256-128-10 (one gather unit per layer),
# SGD with momentum, global batch 512. In one run, REPEATS times each, interleaved:
#   - DDP (example 01, as bench/zero_fashion_mnist.sh runs it);
#   - example 02 at stage 3 on --device cpu (the host runtime, for reference);
#   - example 02 at stages 0-3 on --device sim, without and with --offload optimizer;
# and reports the time per optimizer step (an epoch's training time / its steps; the median over
# the repeats) and the median of the single steps of rank 0 (median over the repeats), with
#   - target: stage 3 on --device sim at most 1.3x DDP's time per step;
#   - offload's extra time per step at every stage (with - without, and the ratio; no target);
# the load averages before and after (the step times compare how two ranks share the cores:
# other load skews them), and prints a Markdown block (command, machine, date, results).
#
# Usage: bench/zero_device_sim.sh [-B BUILD_DIR (default build-release)] [-e EPOCHS] [-r REPEATS] [-m HIDDEN] [-o OUT_DIR] [-- EXTRA OPTIONS]
#   e.g. bench/zero_device_sim.sh -e 1 -r 3
#        bench/zero_device_sim.sh -e 1 -r 1 -- --train-subset 6000     (a quick check that it works)
# The extra options go to both examples (--train-subset, --batch-size, --no-pin, ...).
# Exit status: 0 when the target is met, 2 when it is missed, 1 on errors. Needs jq.
set -euo pipefail

build="build-release"
epochs=2
repeats=3
widths=512,512,256,256,128
out=""
while getopts "B:e:r:m:o:h" opt; do
  case "$opt" in
    B) build=$OPTARG ;;
    e) epochs=$OPTARG ;;
    r) repeats=$OPTARG ;;
    m) widths=$OPTARG ;;
    o) out=$OPTARG ;;
    h) awk 'NR > 1 && /^#/ { print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    *) exit 1 ;;
  esac
done
shift $((OPTIND - 1))
[ "${1:-}" = "--" ] && shift

zero_exe="$build/examples/zero_fashion_mnist"
ddp_exe="$build/examples/ddp_fashion_mnist"
for exe in "$zero_exe" "$ddp_exe"; do
  [ -x "$exe" ] || { echo "error: $exe not found (build the examples first: ninja -C $build examples/zero_fashion_mnist examples/ddp_fashion_mnist)" >&2; exit 1; }
done
command -v jq > /dev/null || { echo "error: jq is needed for the summary" >&2; exit 1; }
[ -n "$out" ] || out="$build/zero_device_sim_bench"
mkdir -p "$out"
rm -f "$out"/*.json

ranks=2
IFS=, read -r -a hidden <<< "$widths"
common=(--ranks "$ranks" --epochs "$epochs" --batch-size 256 --optimizer sgd --lr 0.1 --no-progress)
zero_args=("${common[@]}" --hidden "$(IFS=,; echo "${hidden[*]}")" "$@")
ddp_args=("${common[@]}" --hidden "${hidden[@]}" "$@")
load_before=$(cut -d' ' -f1-3 /proc/loadavg)

# One example 02 run: NAME, then its options; the JSON goes to $out/NAME-REP.json.
zero_run() {
  local name=$1
  shift
  echo "+ $zero_exe $* ${zero_args[*]} --json $out/$name-$rep.json"
  "$zero_exe" "$@" "${zero_args[@]}" --json "$out/$name-$rep.json" | grep -E '^ *epoch|^stage|crc32'
}

for ((rep = 1; rep <= repeats; rep++)); do
  echo "+ $ddp_exe ${ddp_args[*]} --json $out/ddp-$rep.json"
  "$ddp_exe" "${ddp_args[@]}" --json "$out/ddp-$rep.json" | grep -E '^ *epoch|rank\(s\), global'
  zero_run cpu3 --device cpu --stage 3
  for stage in 0 1 2 3; do
    zero_run "sim$stage" --device sim --stage "$stage"
    zero_run "offload$stage" --device sim --stage "$stage" --offload optimizer
  done
done
load_after=$(cut -d' ' -f1-3 /proc/loadavg)

# Median over the repeats of a number each run's JSON gives (jq expression on the files).
median() {
  local expr=$1
  shift
  jq -s "[.[] | $expr] | sort | if length % 2 == 1 then .[length / 2 | floor] else (.[length / 2 - 1] + .[length / 2]) / 2 end" "$@"
}
step() { median '.mean_step_seconds' "$out/$1"-*.json; }
step_median() { median '.median_step_seconds' "$out/$1"-*.json; }
acc() { median '.final_test_accuracy' "$out/$1"-*.json; }
crc() { jq -r '.parameter_crc32' "$out/$1-1.json"; }
step_ddp=$(median '(.runs[0] | ([.epochs[].train_seconds] | add) / (.steps_per_epoch * (.epochs | length)))' "$out"/ddp-*.json)
acc_ddp=$(median '.runs[0].final_test_accuracy' "$out"/ddp-*.json)
ms() { jq -n "$1 * 1000 | . * 100 | round / 100"; }
rel() { jq -n "$1 / $2 * 100 | round / 100"; }
verdict() { if [ "$1" = 1 ]; then echo "met"; else echo "MISSED"; fi; }

t_sim3=$(step sim3)
ratio=$(jq -n "$t_sim3 / $step_ddp")
ok=$(jq -n "$ratio <= 1.3 | if . then 1 else 0 end")

rows=""
for stage in 0 1 2 3; do
  a=$(step "sim$stage") b=$(step "offload$stage")
  rows+="| $stage | $(ms "$a") ($(ms "$(step_median "sim$stage")")) | $(ms "$b") ($(ms "$(step_median "offload$stage")")) |"
  rows+=" $(jq -n "($b - $a) * 1000 | . * 100 | round / 100") | $(rel "$b" "$a") | $(rel "$a" "$step_ddp") |"
  rows+=" $(acc "sim$stage") / $(acc "offload$stage") | $(crc "sim$stage") / $(crc "offload$stage") |"$'\n'
done

cpu=$(lscpu 2> /dev/null | sed -n 's/^Model name: *//p' | head -1)
cat << MD

### ZeRO on the simulated device (host streams) against DDP, and CPU offload there: $ranks ranks ($epochs epoch(s), median of $repeats run(s))

- command: \`bench/zero_device_sim.sh -B $build -e $epochs -r $repeats -m $widths${*:+ -- $*}\` (runs \`${zero_exe#./} --device sim --stage S [--offload optimizer] ${zero_args[*]}\` and \`${ddp_exe#./} ${ddp_args[*]}\`)
- machine: ${cpu:-unknown CPU}, $(nproc) cores, $(uname -sr); date: $(date -u +%Y-%m-%d); load average (1, 5, 15 min) before: $load_before, after: $load_after
- model: MLP 784-$(IFS=-; echo "${hidden[*]}")-10, $(jq '.plan.parameter_elements' "$out/sim0-1.json") float32 parameters, SGD with momentum

Time per step in ms (an epoch's training time / its steps; in parentheses the median single step of
rank 0), each the median over the runs:

| | DDP (example 01) | stage 3, --device cpu | stage 3, --device sim |
|---|---|---|---|
| time per step (ms) | $(ms "$step_ddp") | $(ms "$(step cpu3)") ($(ms "$(step_median cpu3)")) | $(ms "$t_sim3") ($(ms "$(step_median sim3)")) |
| relative to DDP | 1 | $(rel "$(step cpu3)" "$step_ddp") | $(rel "$t_sim3" "$step_ddp") (target <= 1.3: $(verdict "$ok")) |
| test accuracy | $acc_ddp | $(acc cpu3) | $(acc sim3) |

| stage (--device sim) | no offload | --offload optimizer | offload's extra time per step | with / without | no offload / DDP | test accuracy (without / with) | parameters crc32 (without / with) |
|---|---|---|---|---|---|---|---|
${rows}
MD

[ "$ok" = 1 ] && exit 0
exit 2
