#!/usr/bin/env bash
# Step time of two builds of examples/02_zero_fashion_mnist side by side (issue 28's check that the
# one path for host and device memory leaves the step time unchanged): the six-layer MLP
# 784-512-512-256-256-128-10 on 2 ranks, 1 epoch, SGD with momentum, global batch 512, stages 0-3
# on --device cpu (the host runtime) and --device sim (the device path on the host stream). The
# two binaries run in turns, their order alternating from repeat to repeat, and the script prints
# per device and stage each run's mean step time (the example's mean_step_seconds), the medians
# and the ratio AFTER / BEFORE.
#
# Usage: bench/one_path_step_time.sh BEFORE_EXE AFTER_EXE [-r REPEATS (3)] [-o OUT_DIR]
#   e.g. git worktree add --detach /tmp/before a3df178
#        meson setup /tmp/before/build -Dbuildtype=release -Doptimization=2
#        ninja -C /tmp/before/build examples/zero_fashion_mnist
#        bench/one_path_step_time.sh /tmp/before/build/examples/zero_fashion_mnist \
#            build-release/examples/zero_fashion_mnist
# Exit status: 0 when every ratio is at most 1.05, 2 when one is above, 1 on errors. Needs jq.
# Run it on an otherwise idle machine: two ranks share two cores, and any other load skews them.
set -euo pipefail

[ $# -ge 2 ] || { awk 'NR > 1 && /^#/ { print; next } NR > 1 { exit }' "$0"; exit 1; }
before=$1
after=$2
shift 2
repeats=3
out=""
while getopts "r:o:" opt; do
  case "$opt" in
    r) repeats=$OPTARG ;;
    o) out=$OPTARG ;;
    *) exit 1 ;;
  esac
done
for exe in "$before" "$after"; do
  [ -x "$exe" ] || { echo "error: $exe is not an executable" >&2; exit 1; }
done
command -v jq > /dev/null || { echo "error: jq is needed" >&2; exit 1; }
[ -n "$out" ] || out=$(mktemp -d)
mkdir -p "$out"

args=(--ranks 2 --epochs 1 --batch-size 256 --optimizer sgd --lr 0.1 --no-progress --hidden 512,512,256,256,128)
echo "before: $before"
echo "after:  $after"
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg); $(nproc) cores; $(date -u +%FT%TZ)"
for ((rep = 1; rep <= repeats; rep++)); do
  for device in cpu sim; do
    for stage in 0 1 2 3; do
      order=(before after)
      ((rep % 2 == 0)) && order=(after before)
      for which in "${order[@]}"; do
        exe=$before
        [ "$which" = after ] && exe=$after
        "$exe" --device "$device" --stage "$stage" "${args[@]}" --json "$out/$which-$device-$stage-$rep.json" > /dev/null
      done
    done
  done
done

status=0
median='[.[].mean_step_seconds * 1000] | sort | if length % 2 == 1 then .[length / 2 | floor] else (.[length / 2 - 1] + .[length / 2]) / 2 end'
runs='[.[].mean_step_seconds * 1000 | . * 100 | round / 100] | map(tostring) | join(", ")'
echo "| device | stage | before (ms) | after (ms) | ratio |"
echo "|---|---|---|---|---|"
for device in cpu sim; do
  for stage in 0 1 2 3; do
    b=$(jq -s "$median" "$out"/before-"$device"-"$stage"-*.json)
    a=$(jq -s "$median" "$out"/after-"$device"-"$stage"-*.json)
    ratio=$(jq -n "$a / $b * 1000 | round / 1000")
    echo "| $device | $stage | $(jq -rs "$runs" "$out"/before-"$device"-"$stage"-*.json): **$(jq -n "$b * 100 | round / 100")** |" \
      "$(jq -rs "$runs" "$out"/after-"$device"-"$stage"-*.json): **$(jq -n "$a * 100 | round / 100")** | $ratio |"
    jq -e -n "$ratio <= 1.05" > /dev/null || status=2
  done
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg); JSON files in $out"
exit $status
