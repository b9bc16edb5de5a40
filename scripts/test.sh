#!/usr/bin/env bash
# The whole test suite, as CI runs it (.ci/run calls this script):
#   1. installs missing Debian packages (scripts/install_deps.sh),
#   2. builds and tests three configurations, each in its own directory:
#        build-release  release build at -O2 (not Meson's release -O3: a quarter less compile
#                       time, the optimisation level distributions build with): every suite
#                       (cpu, mpi, gpu, header self-containment)
#        build-tsan     ThreadSanitizer, quick collective sweep, -O1
#        build-asan     AddressSanitizer + UndefinedBehaviorSanitizer, quick collective sweep, -O0
#                       (UBSan's checks make the optimiser slow: a checkpoint test took 210 s of
#                       CPU to compile at -O1, 50 s at -O0; ThreadSanitizer 62 s at -O2, 46 s at -O1)
#      (the sanitizer builds leave out MPI, CUDA and libtorch, whose libraries are not instrumented),
#   3. prints one summary line "N passed, N failed" (Meson tests over all configurations).
# Exit status 0 only when every test passed.
set -uo pipefail
cd "$(dirname "$0")/.."
./scripts/install_deps.sh || exit 1

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1"
export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1"
export ASAN_OPTIONS="detect_leaks=1"
jobs=$(nproc)
passed=0
failed=0
skipped=0

run_config() {
  local dir=$1
  shift
  echo "=== configure $dir: $*"
  if [ ! -f "$dir/build.ninja" ]; then
    meson setup "$dir" "$@" >"$dir.setup.log" 2>&1 || { cat "$dir.setup.log"; failed=$((failed + 1)); return; }
  else
    meson configure "$dir" "$@" >/dev/null 2>&1
  fi
  echo "=== build $dir"
  local t0
  t0=$(date +%s)
  if ! ninja -C "$dir" -j "$jobs" >"$dir.build.log" 2>&1; then
    tail -n 60 "$dir.build.log"
    echo "build of $dir FAILED"
    failed=$((failed + 1))
    return
  fi
  echo "=== test $dir (built in $(($(date +%s) - t0)) s)"
  t0=$(date +%s)
  # Sanitized code runs several times slower: their tests get three times the timeouts.
  local multiplier=1
  case "$dir" in build-tsan | build-asan) multiplier=3 ;; esac
  meson test -C "$dir" --print-errorlogs --num-processes "$jobs" --timeout-multiplier "$multiplier" 2>&1 | grep -E '^ *[0-9]+/[0-9]+ |^(Ok|Fail|Skipped|Timeout|Expected Fail|Unexpected Pass):'
  local log="$dir/meson-logs/testlog.json"
  if [ -f "$log" ]; then
    local counts
    counts=$(python3 - "$log" <<'PY'
import json, sys
ok = bad = skip = 0
for line in open(sys.argv[1]):
    line = line.strip()
    if not line:
        continue
    t = json.loads(line)
    r = t["result"]
    if r in ("OK", "EXPECTEDFAIL"):
        ok += 1
    elif r == "SKIP":
        skip += 1
    else:
        bad += 1
        # The failing test's own last lines, so that a CI log says what failed, not only where.
        tail = (t.get("stdout") or "").splitlines()[-40:]
        print("--- " + t["name"] + " (" + r + "): last lines of its output", file=sys.stderr)
        for out in tail:
            print("    " + out, file=sys.stderr)
# The slowest tests, so that a CI log says where the time went.
durations = sorted(((t.get("duration") or 0, t["name"]) for t in map(json.loads, filter(str.strip, open(sys.argv[1])))), reverse=True)
print("slowest: " + ", ".join("%s %.0f s" % (name, d) for d, name in durations[:6]), file=sys.stderr)
print(ok, bad, skip)
PY
)
    read -r o b s <<<"$counts"
    echo "=== $dir: $o passed, $b failed, $s skipped in $(($(date +%s) - t0)) s"
    passed=$((passed + o)); failed=$((failed + b)); skipped=$((skipped + s))
  else
    failed=$((failed + 1))
  fi
}

start=$(date +%s)
run_config build-release -Dbuildtype=release -Doptimization=2 -Dtests=enabled
run_config build-tsan -Ddebug=true -Doptimization=1 -Db_sanitize=thread -Dtest_sweep=quick \
  -Dmpi=disabled -Dcuda=disabled -Dnccl=disabled -Dtorch=disabled -Dexamples=disabled -Dbench=disabled -Dtools=disabled
run_config build-asan -Ddebug=true -Doptimization=0 -Db_sanitize=address,undefined -Db_lundef=false -Dtest_sweep=quick \
  -Dmpi=disabled -Dcuda=disabled -Dnccl=disabled -Dtorch=disabled -Dexamples=disabled -Dbench=disabled -Dtools=disabled
end=$(date +%s)
echo "# test run took $((end - start)) s; skipped (no GPU or other missing hardware): $skipped"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
