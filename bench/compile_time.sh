#!/usr/bin/env bash
# Compile time of a small all_reduce program through <ringzero/ringzero.hpp> against the same
# program written with the standard headers only (docs/performance.md, "Compile time").
#
#   bench/compile_time.sh [runs]        (default 5; CXX and CXXFLAGS are honoured)
#   RINGZERO_ROOT=<other checkout> bench/compile_time.sh   (its include/ and src/: a before/after)
#
# Each variant is compiled and linked into an executable `runs` times, the variants interleaved
# (the machine may be shared), and the median CPU time (user + sys of the compiler and linker)
# and wall time are printed, with the ratio of CPU times to the standard-headers program.
# Variants: std (bench/compile_time/all_reduce_std.cpp), umbrella (header-only, the default),
# separate (RINGZERO_SEPARATE_COMPILATION, linked with src/ringzero.cpp compiled once before:
# its time is printed apart, as a one-time cost). Then the largest -ftime-report entries of
# the two umbrella variants. Every executable is run and must print 6.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
runs=${1:-5}
cxx=${CXX:-g++}
flags=${CXXFLAGS:--O2 -std=c++20}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
src=$root/bench/compile_time
lib=${RINGZERO_ROOT:-$root}
inc=(-I "$lib/include")

# cpu_and_wall CMD...: runs CMD, prints "cpu_seconds wall_seconds".
cpu_and_wall() {
  local TIMEFORMAT='%U %S %R' out
  out=$({ time "$@" >/dev/null 2>&1; } 2>&1 | tail -n 1)
  awk '{ printf "%.2f %.2f\n", $1 + $2, $3 }' <<<"$out"
}

# shellcheck disable=SC2086
compile() {
  case $1 in
    std) $cxx $flags -pthread "$src/all_reduce_std.cpp" -o "$work/std" ;;
    umbrella) $cxx $flags -pthread "${inc[@]}" "$src/all_reduce_umbrella.cpp" -o "$work/umbrella" ;;
    separate) $cxx $flags -pthread -DRINGZERO_SEPARATE_COMPILATION "${inc[@]}" "$src/all_reduce_umbrella.cpp" \
                "$work/ringzero.o" -o "$work/separate" ;;
  esac
}

echo "compiler: $($cxx --version | head -n 1); flags: $flags; runs: $runs"
echo "machine: $(nproc) cores, load average $(cut -d ' ' -f 1-3 /proc/loadavg) at start, $(date -u '+%Y-%m-%d %H:%M UTC')"
variants=(std umbrella)
if [[ -f $lib/src/ringzero.cpp ]]; then
  # shellcheck disable=SC2086
  read -r once_cpu once_wall < <(cpu_and_wall $cxx $flags -pthread -DRINGZERO_SEPARATE_COMPILATION "${inc[@]}" \
    -c "$lib/src/ringzero.cpp" -o "$work/ringzero.o")
  echo "src/ringzero.cpp (separate mode, compiled once): cpu ${once_cpu} s, wall ${once_wall} s"
  variants+=(separate)
fi
declare -A cpu wall
for ((i = 0; i < runs; ++i)); do
  for v in "${variants[@]}"; do
    read -r c w < <(cpu_and_wall compile "$v")
    cpu[$v]+="$c "
    wall[$v]+="$w "
  done
done
for v in "${variants[@]}"; do
  [[ $("$work/$v") == 6 ]] || { echo "$v: the program did not print 6" >&2; exit 1; }
done

median() { tr ' ' '\n' <<<"$1" | grep -v '^$' | sort -g | awk '{ a[NR] = $1 } END { print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }
base=$(median "${cpu[std]}")
printf '\n%-10s %14s %14s %10s   %s\n' variant "cpu median s" "wall median s" "cpu ratio" "cpu of each run"
for v in "${variants[@]}"; do
  c=$(median "${cpu[$v]}")
  printf '%-10s %14.2f %14.2f %9.1fx   %s\n' "$v" "$c" "$(median "${wall[$v]}")" "$(awk -v a="$c" -v b="$base" 'BEGIN { print a / b }')" "${cpu[$v]}"
done
echo "load average $(cut -d ' ' -f 1-3 /proc/loadavg) at end"

# The largest -ftime-report entries (user seconds) of the umbrella compiles, without linking.
for v in "${variants[@]:1}"; do
  extra=()
  [[ $v == separate ]] && extra=(-DRINGZERO_SEPARATE_COMPILATION)
  echo
  echo "-ftime-report, $v (top entries by user time; phases first):"
  # shellcheck disable=SC2086
  $cxx $flags "${extra[@]}" "${inc[@]}" -ftime-report -c "$src/all_reduce_umbrella.cpp" -o "$work/report.o" 2>&1 |
    awk -F: '/%\)/ && !/TOTAL/ { split($2, f, " "); name = $1; gsub(/^ +| +$/, "", name); print f[1], name }' |
    sort -gr | awk '/phase/ { print "  " $0; next } { rest[++n] = "  " $0 } END { for (i = 1; i <= 8 && i <= n; ++i) print rest[i] }'
done
