#!/usr/bin/env bash
# Benchmark of ZeRO training (examples/02_zero_fashion_mnist) against data parallelism
# (examples/01_ddp_fashion_mnist) on Fashion-MNIST, 2 ranks, the six-layer MLP
# 784-512-512-256-256-128-10 (one gather unit per layer), SGD with momentum, global batch 512.
# It runs stages 0, 1, 2 and 3 and the DDP example, REPEATS times each, interleaved, and reports
#   - model-state memory per rank measured in the trainer against the plan, at every stage:
#     the growth of the process heap while the runtime was built (malloc's statistics, divided
#     by the ranks; an independent measurement) and the runtime's own allocations
#     (memory_in_use), target: within 5% of shard_plan::memory() (the heap: of model states plus
#     the communication buffers, which the runtime allocates in its constructor too);
#   - stage 3's model-state memory per rank against 1/N of stage 0's (measured) plus the largest
#     gather unit, target: at most that;
#   - the time per optimizer step (training time of an epoch / steps, the median over the
#     repeats) of every stage and of DDP, target: stage 3 at most 1.3x DDP's;
# and prints a Markdown block (command, machine, date, results) for docs/performance.md.
#
# Usage: bench/zero_fashion_mnist.sh [-B BUILD_DIR (default build-release)] [-e EPOCHS] [-r REPEATS] [-m HIDDEN] [-o OUT_DIR] [-- EXTRA OPTIONS]
#   e.g. bench/zero_fashion_mnist.sh -B build-release -e 3 -r 3
#        bench/zero_fashion_mnist.sh -e 1 -r 1 -- --train-subset 6000     (a quick check that it works)
#        bench/zero_fashion_mnist.sh -m 256,128                            (example 01's 3-layer MLP)
# -m sets the hidden widths (default 512,512,256,256,128). The extra options go to both examples
# (--train-subset, --batch-size, --no-pin, ...).
# Exit status: 0 when every target is met, 2 when one is missed, 1 on errors.
# Needs jq. Run it on an otherwise idle machine: the step times compare how two ranks share two
# cores, and any other load skews them.
set -euo pipefail

build=build-release  # the release build that scripts/main.sh makes
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
[ -n "$out" ] || out="$build/zero_fashion_mnist_bench"
mkdir -p "$out"

ranks=2
IFS=, read -r -a hidden <<< "$widths"
common=(--ranks "$ranks" --epochs "$epochs" --batch-size 256 --optimizer sgd --lr 0.1 --no-progress)
zero_args=("${common[@]}" --hidden "$(IFS=,; echo "${hidden[*]}")" "$@")
ddp_args=("${common[@]}" --hidden "${hidden[@]}" "$@")

for ((rep = 1; rep <= repeats; rep++)); do
  for stage in 0 1 2 3; do
    echo "+ $zero_exe --stage $stage ${zero_args[*]} --json $out/stage$stage-$rep.json"
    "$zero_exe" --stage "$stage" "${zero_args[@]}" --json "$out/stage$stage-$rep.json" | grep -E '^ *epoch|^stage'
  done
  echo "+ $ddp_exe ${ddp_args[*]} --json $out/ddp-$rep.json"
  "$ddp_exe" "${ddp_args[@]}" --json "$out/ddp-$rep.json" | grep -E '^ *epoch|rank\(s\), global'
done

# Median over the repeats of a number each run's JSON gives (jq expression on the file).
median() {
  local expr=$1
  shift
  jq -s "[.[] | $expr] | sort | if length % 2 == 1 then .[length / 2 | floor] else (.[length / 2 - 1] + .[length / 2]) / 2 end" "$@"
}
step_zero() { median '.mean_step_seconds' "$out"/stage"$1"-*.json; }
step_ddp=$(median '(.runs[0] | ([.epochs[].train_seconds] | add) / (.steps_per_epoch * (.epochs | length)))' "$out"/ddp-*.json)
ms() { jq -n "$1 * 1000 | . * 100 | round / 100"; }
bytes() { jq -n "$1 | if . >= 1048576 then \"\(. / 1048576 * 100 | round / 100) MiB\" else \"\(. / 1024 * 100 | round / 100) KiB\" end" -r; }
pct() { jq -n "$1 * 100 | . * 100 | round / 100"; }
verdict() { if [ "$1" = 1 ]; then echo "met"; else echo "MISSED"; fi; }

ok_all=1
memory_rows=""
for stage in 0 1 2 3; do
  f="$out/stage$stage-1.json"
  planned=$(jq '.plan.memory.model_states' "$f")
  measured=$(jq '[.memory[].measured.model_states] | max' "$f")
  heap=$(jq '.heap_growth_per_rank.construction // empty' "$f")
  buffers_planned=$(jq '.plan.memory.communication_buffers' "$f")
  buffers_measured=$(jq '[.memory[].measured.communication_buffers] | max' "$f")
  # The runtime's own count must equal the plan exactly; the heap growth while the runtime was
  # built (an independent measurement, when malloc's statistics are available; it allocates its
  # pooled communication buffers there too) must be within 5% of model states + buffers.
  ok=$(jq -n "$measured == $planned | if . then 1 else 0 end")
  if [ -n "$heap" ]; then
    dev=$(jq -n "($heap - $planned - $buffers_planned) / ($planned + $buffers_planned)")
    ok=$(jq -n "$ok == 1 and ($dev | fabs) <= 0.05 | if . then 1 else 0 end")
    heap_text="$(bytes "$heap") ($(pct "$dev")%)"
  else
    heap_text="(no malloc statistics)"
  fi
  [ "$ok" = 1 ] || ok_all=0
  memory_rows+="| $stage | $(bytes "$planned") | $(bytes "$measured") | $heap_text | $(bytes "$buffers_planned") / $(bytes "$buffers_measured") | $(verdict "$ok") |"$'\n'
done

s0=$(jq '[.memory[].measured.model_states] | max' "$out/stage0-1.json")
s3=$(jq '[.memory[].measured.model_states] | max' "$out/stage3-1.json")
unit=$(jq '.largest_unit_bytes' "$out/stage3-1.json")
units=$(jq '.plan.units | length' "$out/stage3-1.json")
bound=$(jq -n "$s0 / $ranks + $unit")
ok_bound=$(jq -n "$s3 <= $bound | if . then 1 else 0 end")
[ "$ok_bound" = 1 ] || ok_all=0

t0=$(step_zero 0); t1=$(step_zero 1); t2=$(step_zero 2); t3=$(step_zero 3)
ratio=$(jq -n "$t3 / $step_ddp")
ok_time=$(jq -n "$ratio <= 1.3 | if . then 1 else 0 end")
[ "$ok_time" = 1 ] || ok_all=0
acc() { median '.final_test_accuracy' "$out"/stage"$1"-*.json; }
acc_ddp=$(median '.runs[0].final_test_accuracy' "$out"/ddp-*.json)
runtime3=$(median '([.epochs[] | .runtime_gather_seconds + .runtime_reduce_seconds + .runtime_step_seconds] | add) / ([.epochs[].steps] | add)' "$out"/stage3-*.json)

cpu=$(lscpu 2> /dev/null | sed -n 's/^Model name: *//p' | head -1)
cat << MD

### ZeRO stages on Fashion-MNIST: memory per rank and step time on $ranks ranks ($epochs epoch(s), median of $repeats run(s))

- command: \`bench/zero_fashion_mnist.sh -B $build -e $epochs -r $repeats -m $widths${*:+ -- $*}\` (runs \`${zero_exe#./} --stage S ${zero_args[*]}\` and \`${ddp_exe#./} ${ddp_args[*]}\`)
- machine: ${cpu:-unknown CPU}, $(nproc) cores, $(uname -sr); date: $(date -u +%Y-%m-%d)
- model: MLP 784-$(IFS=-; echo "${hidden[*]}")-10, $(jq '.plan.parameter_elements' "$out/stage0-1.json") float32 parameters, $units gather units (one per layer); SGD with momentum (one state per element), no master copy

Model-state memory per rank (parameters + gradients + optimizer states), measured in the trainer
(heap growth while the runtime was built, malloc statistics / $ranks, within 5% of the planned
model states plus communication buffers, which the runtime allocates there too;
and the runtime's own count, memory_in_use, equal to the plan byte for byte) against the plan;
communication buffers (gather buffers, gradient buckets) are not model states and are listed apart:

| stage | planned | runtime's allocations | heap growth (vs plan) | comm. buffers planned / allocated | as planned (exact; heap within 5%) |
|---|---|---|---|---|---|
${memory_rows}
| target | measured | bound | |
|---|---|---|---|
| stage 3 model states <= stage 0's / $ranks + largest gather unit | $(bytes "$s3") | $(bytes "$s0") / $ranks + $(bytes "$unit") = $(bytes "$bound") | $(verdict "$ok_bound") |

| | DDP (example 01) | stage 0 | stage 1 | stage 2 | stage 3 |
|---|---|---|---|---|---|
| time per step (ms) | $(ms "$step_ddp") | $(ms "$t0") | $(ms "$t1") | $(ms "$t2") | $(ms "$t3") |
| relative to DDP | 1 | $(jq -n "$t0 / $step_ddp * 100 | round / 100") | $(jq -n "$t1 / $step_ddp * 100 | round / 100") | $(jq -n "$t2 / $step_ddp * 100 | round / 100") | $(jq -n "$ratio * 100 | round / 100") (target <= 1.3: $(verdict "$ok_time")) |
| test accuracy after epoch $epochs | $acc_ddp | $(acc 0) | $(acc 1) | $(acc 2) | $(acc 3) |

Stage 3 spends $(ms "$runtime3") ms per step inside the runtime's calls (gathers and their waits,
gradient views and reductions, the optimizer step) on rank 0.
MD

[ "$ok_all" = 1 ] && exit 0
exit 2
