#!/usr/bin/env python3
"""The command line of ringzero-bench (needs no GPU):
- --devices takes a comma-separated list, as -d, -o and -r do, and refuses what is not a list of
  device indices; it selects CUDA devices, so with --memory host it is an error, not ignored;
- the host-memory guard also covers --memory cuda, whose ranks hold host mirrors of their -e
  buffers;
- integer options (-f, -n, -w, -c, --ranks) take decimal digits only;
- --json is checked before measuring without creating the file: a run that fails leaves no file
  behind and never truncates one the user already had; a run that succeeds writes it;
- --reproducible checks every dtype and op bitwise, says so in the header and the JSON, and is
  refused with --memory cuda;
- --ranks is refused beyond 64 rank threads per CPU this process may use (--ranks 4096 ran over
  300 s without a line of output on 2 CPUs), naming the option, the value and the limit;
- --background-load N runs N busy threads at nice 10 while measuring, says so in the header and
  the JSON, and takes 0 to 256 in decimal digits;
- the footer's "Avg bus bandwidth" leaves out placements whose busbw measures no bandwidth (a
  broadcast in place on one rank moves nothing: it averaged in 4-10 TB/s) and says so.

usage: check_ringzero_bench_options.py RINGZERO_BENCH

Exit status of ringzero-bench: CLI11's validation error (105) for a refused option, 2 for a run
that fails, 0 for one that measured every row right.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from command_check import check, run, finish  # noqa: E402

VALIDATION_ERROR = 105  # CLI::ExitCodes::ValidationError, as ringzero-bench's other usage errors
SMALL = ["all_reduce", "-b", "1K", "-e", "1K", "-n", "1", "-w", "0", "--bandwidth-bytes", "64K"]


def without_cuda(p):
    """A build without the CUDA runtime refuses --memory cuda before anything else."""
    return p.returncode == VALIDATION_ERROR and "built without the CUDA runtime" in p.stderr


def main() -> int:
    bench = sys.argv[1]

    # --devices: a comma-separated list (it answered "Could not convert: --devices = 0,1").
    p = run(bench, *SMALL, "--ranks", "2", "--memory", "cuda", "--devices", "0,1")
    check("Could not convert" not in p.stderr, "--devices 0,1 is not parsed as a list")
    if not without_cuda(p):
        # No GPU here: the run fails on the device (exit 2); with two GPUs it measures (exit 0).
        check(p.returncode in (0, 2) and "--devices" not in p.stderr, f"--devices 0,1: exit status {p.returncode}")
        for bad in ["0,x", "+1", " 1", "0,,1", "-1", "all", ""]:
            p = run(bench, *SMALL, "--memory", "cuda", "--devices", bad)
            check(p.returncode == VALIDATION_ERROR and "--devices" in p.stderr,
                  f"--devices '{bad}': exit status {p.returncode}, expected {VALIDATION_ERROR} naming --devices")
    # --devices with host memory: an error, not ignored.
    for memory in [[], ["--memory", "host"]]:
        p = run(bench, *SMALL, "--ranks", "2", *memory, "--devices", "3")
        check(p.returncode == VALIDATION_ERROR and "--devices" in p.stderr and "--memory" in p.stderr,
              f"{memory} --devices 3: exit status {p.returncode}, expected {VALIDATION_ERROR} naming --devices and --memory")
        check("# Errors" not in p.stdout, f"{memory} --devices 3: the benchmark ran")

    # The host-memory guard with --memory cuda: 2 ranks x 2 host mirrors of -e 1000G.
    physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    if physical < 3000 * (1 << 30):
        p = run(bench, "all_reduce", "-e", "1000G", "--ranks", "2", "--memory", "cuda")
        if not without_cuda(p):
            check(p.returncode == VALIDATION_ERROR and "host memory" in p.stderr and "--memory cuda" in p.stderr,
                  f"--memory cuda -e 1000G: exit status {p.returncode}, expected {VALIDATION_ERROR} and the host-memory guard")

    # Integer options: digits only (CLI11 read -f -1 as 2^64 - 1 and ran one row).
    for option, bad in [("-f", "-1"), ("-f", "0x2"), ("-n", "+3"), ("-w", "-1"), ("-c", " 1"), ("--ranks", "2.0")]:
        p = run(bench, *SMALL, option, bad)
        check(p.returncode == VALIDATION_ERROR and "not a whole number" in p.stderr and "# Errors" not in p.stdout,
              f"{option} '{bad}': exit status {p.returncode}, expected {VALIDATION_ERROR} before measuring")

    # --ranks: at most 64 rank threads per CPU of this process's affinity (and 4096), refused at once.
    limit = min(4096, 64 * len(os.sched_getaffinity(0)))
    for ranks in sorted({limit + 1, 4096}):
        if ranks > limit:
            try:
                p = run(bench, *SMALL, "--ranks", str(ranks), timeout=30)
            except subprocess.TimeoutExpired:
                check(False, f"--ranks {ranks}: still running after 30 s, expected a refusal at once")
                continue
            check(p.returncode == VALIDATION_ERROR and "--ranks" in p.stderr and f"{ranks} rank threads" in p.stderr
                  and f"more than the {limit} " in p.stderr and "# Errors" not in p.stdout,
                  f"--ranks {ranks}: exit status {p.returncode}, expected {VALIDATION_ERROR} naming the limit {limit}")
    taskset = shutil.which("taskset")
    if taskset:  # on one CPU the limit is 64: 64 ranks run, 65 are refused
        cpu = str(min(os.sched_getaffinity(0)))
        p = run(taskset, "-c", cpu, bench, *SMALL, "--ranks", "64")
        check(p.returncode == 0 and "# Errors: 0 wrong" in p.stdout, f"64 ranks on one CPU: exit status {p.returncode}")
        p = run(taskset, "-c", cpu, bench, *SMALL, "--ranks", "65")
        check(p.returncode == VALIDATION_ERROR and "65 rank threads are more than the 64 this process allows" in p.stderr,
              f"65 ranks on one CPU: exit status {p.returncode}, expected {VALIDATION_ERROR}")

    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "bench.json")
        # The footer averages only the busbw that measures a bandwidth: a broadcast in place on one
        # rank moves nothing in ~0.3 us, and its 1 MiB "busbw" of ~4000 GB/s was averaged in.
        p = run(bench, "broadcast", "-b", "1M", "-e", "1M", "-n", "3", "-w", "1", "--ranks", "1",
                "--bandwidth-bytes", "64K", "--json", path)
        if check(p.returncode == 0, f"broadcast on one rank: exit status {p.returncode}"):
            with open(path) as f:
                doc = json.load(f)
            oop = doc["rows"][0]["out_of_place"]["busbw_gbps"]
            footer = [line for line in p.stdout.splitlines() if line.startswith("# Avg bus bandwidth    : ")]
            check(len(footer) == 1 and footer[0].split()[-1] == f"{oop:.4f}",
                  f"broadcast on one rank: footer {footer}, expected the out-of-place busbw {oop:.4f} alone")
            check("#   (averaged over 1 of 2 placement(s); left out, as their busbw measures no bandwidth: 1 moved no "
                  "bytes (in place on one rank))" in p.stdout, "broadcast on one rank: the footer does not say what it left out")
            check(doc.get("avg_busbw_gbps") == oop and doc.get("avg_busbw_left_out") == 1,
                  f"broadcast on one rank: JSON avg_busbw_gbps {doc.get('avg_busbw_gbps')}, left out "
                  f"{doc.get('avg_busbw_left_out')}, expected {oop} and 1")
            os.unlink(path)
        # Runs that fail after the --json check: no file left behind.
        failing = [
            # no size from -b to -e holds an element: exit 2 after measuring nothing
            ["all_reduce", "-b", "2", "-e", "3", "--ranks", "2", "--bandwidth-bytes", "64K"],
            # a CUDA device that is not there (or a build without CUDA: refused before)
            [*SMALL, "--ranks", "2", "--memory", "cuda", "--devices", "1023"],
        ]
        for args in failing:
            p = run(bench, *args, "--json", path)
            check(p.returncode != 0, f"{args}: exit status 0, expected a failure")
            check(not os.path.exists(path), f"{args}: the failed run left {path} behind")
            # A file the user had stays as it was.
            with open(path, "w") as f:
                f.write('{"kept": true}\n')
            p = run(bench, *args, "--json", path)
            with open(path) as f:
                kept = f.read()
            check(p.returncode != 0 and kept == '{"kept": true}\n', f"{args}: the failed run changed the existing {path}")
            os.unlink(path)
        # An unwritable path: refused before measuring, naming the path.
        p = run(bench, *SMALL, "--ranks", "2", "--json", os.path.join(d, "no-such-dir", "bench.json"))
        check(p.returncode == VALIDATION_ERROR and "no-such-dir" in p.stderr and "# Errors" not in p.stdout,
              f"--json in a missing directory: exit status {p.returncode}, expected {VALIDATION_ERROR} before measuring")
        # A run that succeeds writes the file (over the one that was there).
        with open(path, "w") as f:
            f.write("old")
        p = run(bench, *SMALL, "--ranks", "2", "--json", path)
        if check(p.returncode == 0, f"a small run: exit status {p.returncode}"):
            with open(path) as f:
                doc = json.load(f)
            check(doc.get("program") == "ringzero-bench" and len(doc.get("rows", [])) == 1, "the JSON of a small run")
        # A barrier moves no data: one row of size 0 and count 0, whatever -b/-e say.
        p = run(bench, "barrier", "-b", "1K", "-e", "1M", "-n", "3", "-w", "1", "--ranks", "2", "--json", path)
        if check(p.returncode == 0, f"barrier: exit status {p.returncode}"):
            with open(path) as f:
                rows = json.load(f).get("rows", [])
            check(len(rows) == 1 and rows[0].get("size_bytes") == 0 and rows[0].get("count") == 0,
                  f"barrier with -b 1K -e 1M: rows {[(r.get('size_bytes'), r.get('count')) for r in rows]}, expected one of size 0")

        # --reproducible: every dtype and op checks bitwise (the floating sum/avg/premulsum rows in
        # reproducible mode, the others as usual); the header and the JSON say so.
        p = run(bench, "all_reduce", "-b", "4K", "-e", "4K", "-n", "1", "-w", "0", "--ranks", "3", "-d", "all", "-o", "all",
                "--bandwidth-bytes", "64K", "--reproducible", "--json", path)
        if check(p.returncode == 0 and "# Errors: 0 wrong" in p.stdout, f"--reproducible: exit status {p.returncode}"):
            check("reproducible mode" in p.stdout, "--reproducible: the header does not say reproducible mode")
            with open(path) as f:
                doc = json.load(f)
            check(doc.get("reproducible") is True and len(doc.get("rows", [])) == 60,
                  f"--reproducible: JSON reproducible={doc.get('reproducible')}, {len(doc.get('rows', []))} rows, expected 60")
        p = run(bench, *SMALL, "--ranks", "2", "--memory", "cuda", "--reproducible")
        if not without_cuda(p):
            check(p.returncode == VALIDATION_ERROR and "--reproducible" in p.stderr,
                  f"--reproducible --memory cuda: exit status {p.returncode}, expected {VALIDATION_ERROR} naming --reproducible")

    # --background-load: 0-256 busy threads at nice 10; the header and the JSON say how many.
    for bad in ["-1", "257", "x", "1.5", ""]:
        p = run(bench, *SMALL, "--ranks", "2", "--background-load", bad)
        check(p.returncode == VALIDATION_ERROR and "--background-load" in p.stderr and "# Errors" not in p.stdout,
              f"--background-load '{bad}': exit status {p.returncode}, expected {VALIDATION_ERROR} naming the option")
    with tempfile.TemporaryDirectory(prefix="ringzero-bench-load-") as tmp:
        path = os.path.join(tmp, "load.json")
        p = run(bench, *SMALL, "--ranks", "2", "--background-load", "2", "--json", path)
        if check(p.returncode == 0 and "# Errors: 0 wrong" in p.stdout, f"--background-load 2: exit status {p.returncode}"):
            check("background load 2 busy thread(s) at nice 10" in p.stdout,
                  "--background-load 2: the header does not name the load")
            with open(path) as f:
                doc = json.load(f)
            check(doc.get("background_load_threads") == 2,
                  f"--background-load 2: JSON background_load_threads={doc.get('background_load_threads')}")
        p = run(bench, *SMALL, "--ranks", "2", "--json", path)
        if check(p.returncode == 0, f"no --background-load: exit status {p.returncode}"):
            check("background load" not in p.stdout, "no --background-load: the header names a load")
            with open(path) as f:
                check(json.load(f).get("background_load_threads") == 0, "no --background-load: JSON not 0")

    return finish()


if __name__ == "__main__":
    sys.exit(main())
