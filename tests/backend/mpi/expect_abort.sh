#!/usr/bin/env bash
# Runs an MPI job that must end on its own, and checks how it ended.
# Usage: expect_abort.sh EXIT PATTERN MAX_SECONDS -- COMMAND...
#   EXIT         the job's expected exit status, or "nonzero"
#   PATTERN      an extended regular expression its output (stdout + stderr) must match ("" for any)
#   MAX_SECONDS  the job must end within this many seconds (it is killed after twice that)
set -u
want_exit=$1 pattern=$2 max_seconds=$3
shift 3
[ "$1" = "--" ] && shift
start_ms=$(($(date +%s%N) / 1000000))
output=$(timeout --kill-after=5 $((2 * max_seconds)) "$@" 2>&1)
status=$?
elapsed_ms=$(($(date +%s%N) / 1000000 - start_ms))
echo "$output"
echo "--- exit status $status after ${elapsed_ms} ms"
ok=1
if [ "$want_exit" = "nonzero" ]; then
  [ "$status" -ne 0 ] || { echo "FAIL: expected a non-zero exit status"; ok=0; }
else
  [ "$status" -eq "$want_exit" ] || { echo "FAIL: expected exit status $want_exit"; ok=0; }
fi
if [ -n "$pattern" ] && ! grep -Eq "$pattern" <<<"$output"; then
  echo "FAIL: the output does not match: $pattern"
  ok=0
fi
if [ "$elapsed_ms" -gt $((max_seconds * 1000)) ]; then
  echo "FAIL: took longer than $max_seconds s"
  ok=0
fi
[ "$ok" -eq 1 ] && echo "OK" && exit 0
exit 1
