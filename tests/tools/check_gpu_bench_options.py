#!/usr/bin/env python3
"""The command line of ringzero-gpu-bench, checked without a GPU (and the same with one):
- counts are decimal digits only: --ranks "2, 4", --ranks +2 and the like are refused (strtoll
  took them), with the option and the value named;
- --size-mib is checked against the host memory before anything is allocated (the bench fills
  two --size-mib buffers on the host);
- --json is checked without creating the file: a run that fails leaves no file behind and never
  changes one the user already had;
- an error names the program once ("ringzero-gpu-bench: ringzero: ringzero-gpu-bench: no CUDA
  device" named it twice).

usage: check_gpu_bench_options.py RINGZERO_GPU_BENCH

Exit status of ringzero-gpu-bench: 2 for a bad option or an error (no device), 1 for a wrong
result, 0 otherwise. --device 1023 makes a run fail on any machine (no device, or no such device).
"""
import os
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from command_check import check, run, finish  # noqa: E402


def main() -> int:
    bench = sys.argv[1]
    name = os.path.basename(bench)

    # Whole numbers: digits only.
    for option, value in [("--ranks", "2, 4"), ("--ranks", "+2"), ("--ranks", " 2"), ("--ranks", "2,+4"),
                          ("--ranks", "2,,4"), ("--ranks", "1"), ("--size-mib", "+16"), ("--size-mib", " 16"),
                          ("--size-mib", "-1"), ("--iters", "0x10"), ("--warmup", "-0"), ("--device", "+0")]:
        p = run(bench, option, value, "--device", "1023") if option != "--device" else run(bench, option, value)
        check(p.returncode == 2, f"{option} '{value}': exit status {p.returncode}, expected 2")
        check(option in p.stderr and f"'{value}'" in p.stderr and "whole number" in p.stderr,
              f"{option} '{value}': the error does not name the option and the value")

    # The host-memory check, before the device: two buffers of --size-mib 1048576 (1 TiB each).
    physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    if physical < (1 << 41):
        p = run(bench, "--size-mib", "1048576", "--device", "1023")
        check(p.returncode == 2 and "host memory" in p.stderr and "--size-mib 1048576" in p.stderr,
              f"--size-mib 1048576: exit status {p.returncode}, expected 2 and the host-memory check")

    # The program's name once, whatever the device error.
    p = run(bench, "--device", "1023", "--no-collectives")
    check(p.returncode == 2, f"--device 1023: exit status {p.returncode}, expected 2")
    check(p.stderr.count(name) == 1 and p.stderr.startswith(name + ": "),
          f"--device 1023: the error should name {name} once, at its start")
    check("ringzero: " not in p.stderr, "--device 1023: the error repeats the library's name")

    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "gpu_bench.json")
        p = run(bench, "--json", path, "--device", "1023")
        check(p.returncode == 2, f"--json with --device 1023: exit status {p.returncode}, expected 2")
        check(not os.path.exists(path), f"the failed run left {path} behind")
        with open(path, "w") as f:
            f.write('{"kept": true}\n')
        p = run(bench, "--json", path, "--device", "1023")
        with open(path) as f:
            kept = f.read()
        check(p.returncode == 2 and kept == '{"kept": true}\n', f"the failed run changed the existing {path}")
        p = run(bench, "--json", os.path.join(d, "no-such-dir", "x.json"), "--device", "1023")
        check(p.returncode == 2 and "--json" in p.stderr and "no-such-dir" in p.stderr, "--json in a missing directory")

    return finish()


if __name__ == "__main__":
    sys.exit(main())
