"""What the command-line checks (tests/*/check_*.py) share: running a program with its output
captured and shown, recording failed checks without stopping at the first, and the exit status.

Use: sys.path.insert(0, <this folder>); from command_check import check, run, finish.
"""
import subprocess

failures = []


def check(ok, message):
    """Records `message` as a failure unless `ok`; returns `ok` (to guard dependent checks)."""
    if not ok:
        failures.append(message)
        print("FAIL: " + message)
    return ok


def run(program, *args, timeout=120):
    """Runs `program` with `args`, output captured; prints the command, exit status and stderr."""
    p = subprocess.run([program, *args], capture_output=True, text=True, timeout=timeout)
    err = p.stderr.strip().replace("\n", " | ")
    print(f"$ {' '.join([program, *args])}\n  exit status {p.returncode}; stderr: {err[:400]}")
    return p


def check_refused_options(program, refused, missing_data, exit_status):
    """Runs `program OPTION VALUE --data missing_data --epochs 1 --no-progress` for each
    (OPTION, VALUE) of `refused`: each must exit with `exit_status`, name the option and the value,
    and never reach the data (a value that got through would report the missing directory)."""
    for option, value in refused:
        p = run(program, option, value, "--data", missing_data, "--epochs", "1", "--no-progress")
        check(p.returncode == exit_status, f"{option} {value!r}: exit status {p.returncode}, expected {exit_status}")
        check(option in p.stderr and value.strip() in p.stderr, f"{option} {value!r}: the error names neither the option nor the value")
        check(missing_data not in p.stderr, f"{option} {value!r}: accepted (the trainer went on to load the data)")


def finish():
    """The exit status of a check script: 0 when no check failed, 1 otherwise."""
    print(f"{len(failures)} failure(s)")
    return 1 if failures else 0
