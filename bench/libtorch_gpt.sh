#!/usr/bin/env bash
# Benchmark of example 04 (a small libtorch GPT): the time per optimizer step of --strategy zero3
# (integration/torch_zero.hpp) against --strategy ddp (integration/torch_ddp.hpp with
# torch::optim::AdamW) on 2 ranks, REPEATS runs of each, alternating (ddp, zero3, ddp, zero3, ...),
# the median over the runs of each run's median step time; target: zero3 at most 1.3x ddp. Also
# reports tokens/s, the final loss of both (equal within float32 rounding: torch's AdamW rounds
# otherwise than the runtime's; relative 1e-5 is checked) and the parameter memory per rank
# (zero3: parameter shard + gather buffers + gradient buckets; ddp: the whole model).
# Prints a Markdown block (command, machine, date, results) for docs/performance.md.
#
# Usage: bench/libtorch_gpt.sh [-B BUILD_DIR (default build-release)] [-s STEPS] [-r REPEATS] [-o OUT_DIR] [-- EXTRA OPTIONS]
#   e.g. bench/libtorch_gpt.sh -s 60 -r 5
#        bench/libtorch_gpt.sh -s 60 -r 5 -- --bf16          (bfloat16 compute, float32 master)
#        bench/libtorch_gpt.sh -s 5 -r 1 -- --layers 1       (a quick check that it runs)
# The extra options go to both runs (--layers, --embd, --bf16, ...; not the ZeRO-only ones, such as
# --wrap, which --strategy ddp refuses).
# Exit status: 0 when the target is met, 2 when it is missed, 1 on errors.
# Needs jq and the fortunes package. Run it on an otherwise idle machine.
set -euo pipefail

build=build-release
steps=60
repeats=5
out=""
while getopts "B:s:r:o:h" opt; do
  case "$opt" in
    B) build=$OPTARG ;;
    s) steps=$OPTARG ;;
    r) repeats=$OPTARG ;;
    o) out=$OPTARG ;;
    h) awk 'NR > 1 && /^#/ { print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    *) exit 1 ;;
  esac
done
shift $((OPTIND - 1))
[ "${1:-}" = "--" ] && shift

exe="$build/examples/libtorch_gpt"
[ -x "$exe" ] || { echo "error: $exe not found (ninja -C $build examples/libtorch_gpt; needs libtorch-dev)" >&2; exit 1; }
command -v jq > /dev/null || { echo "error: jq is needed for the summary" >&2; exit 1; }
[ -n "$out" ] || out="$build/libtorch_gpt_bench"
mkdir -p "$out"
rm -f "$out"/ddp-*.json "$out"/zero3-*.json

ranks=2
args=(--ranks "$ranks" --steps "$steps" --generate 0 --print-every 1000000 "$@")
for ((rep = 1; rep <= repeats; rep++)); do
  for strategy in ddp zero3; do
    echo "+ $exe --strategy $strategy ${args[*]} --json $out/$strategy-$rep.json"
    "$exe" --strategy "$strategy" "${args[@]}" --json "$out/$strategy-$rep.json" | grep -E 'tokens/s,'
  done
done

median() {
  local expr=$1
  shift
  jq -s "[.[] | $expr] | sort | if length % 2 == 1 then .[length / 2 | floor] else (.[length / 2 - 1] + .[length / 2]) / 2 end" "$@"
}
ms() { jq -n "$1 * 1000 | . * 100 | round / 100"; }
t_ddp=$(median '.median_step_seconds' "$out"/ddp-*.json)
t_z3=$(median '.median_step_seconds' "$out"/zero3-*.json)
tps_ddp=$(median '.tokens_per_second' "$out"/ddp-*.json)
tps_z3=$(median '.tokens_per_second' "$out"/zero3-*.json)
ratio=$(jq -n "$t_z3 / $t_ddp | . * 1000 | round / 1000")
ok=$(jq -n "$t_z3 <= 1.3 * $t_ddp | if . then 1 else 0 end")
loss_ddp=$(jq '.losses[-1]' "$out/ddp-1.json")
loss_z3=$(jq '.losses[-1]' "$out/zero3-1.json")
same=$(jq -n "(($loss_ddp - $loss_z3) | fabs) <= 1e-5 * ($loss_z3 | fabs) | if . then \"yes\" else \"NO\" end" -r)
mem() { jq "(.memory_measured.parameters + .memory_measured.communication_buffers)" "$1"; }
m_ddp=$(mem "$out/ddp-1.json")
m_z3=$(mem "$out/zero3-1.json")
m_plan=$(jq "(.memory_planned.parameters + .memory_planned.communication_buffers)" "$out/zero3-1.json")
elements=$(jq '[.parameters[] | select(.tie == null or .tie == .name) | .shape | reduce .[] as $d (1; . * $d)] | add' "$out/ddp-1.json")

cpu=$(lscpu 2> /dev/null | sed -n 's/^Model name: *//p' | head -1)
cat << MD

### libtorch GPT (example 04): zero3 against ddp on $ranks ranks ($steps steps, median of $repeats runs each, alternating)

- command: \`bench/libtorch_gpt.sh -B $build -s $steps -r $repeats${*:+ -- $*}\` (runs \`$exe --strategy ddp|zero3 ${args[*]}\`)
- machine: ${cpu:-unknown CPU}, $(nproc) cores, $(uname -sr); date: $(date -u +%Y-%m-%d)
- model: $(jq -r '"\(.parameters | length) parameter tensors, wrap \(.wrap)"' "$out/zero3-1.json"), $elements parameter elements

| strategy | median step | tokens/s | final loss | parameter memory per rank (params + comm. buffers) |
|---|---|---|---|---|
| ddp (torch_ddp) | $(ms "$t_ddp") ms | $(jq -n "$tps_ddp | round") | $loss_ddp | $m_ddp B |
| zero3 | $(ms "$t_z3") ms | $(jq -n "$tps_z3 | round") | $loss_z3 | $m_z3 B (plan: $m_plan B) |

zero3 / ddp step time: $ratio (target <= 1.3: $(if [ "$ok" = 1 ]; then echo met; else echo MISSED; fi)); same final loss (relative 1e-5): $same
MD
[ "$ok" = 1 ] || exit 2
