#!/usr/bin/env python3
"""`TRAINER --device cuda` (example 01 or 02) must fail at once, with exit status 1 and a clear message,
where it cannot train on a GPU: on a machine without a CUDA device it says "no CUDA device"
(and what the CUDA runtime answered) before loading any data; in a build without CUDA it says
that the build has no CUDA support. On a machine with a GPU it gets past that check, and the
missing data directory given here must then be the error it reports.

usage: check_trainer_device_cuda.py TRAINER
"""
import os
import subprocess
import sys
import tempfile


def main() -> int:
    trainer = sys.argv[1]
    missing = os.path.join(tempfile.gettempdir(), "ringzero-no-such-fashion-mnist-dir")
    args = [trainer, "--device", "cuda", "--ranks", "2", "--epochs", "1", "--no-progress", "--data", missing]
    p = subprocess.run(args, capture_output=True, text=True, timeout=60)
    err = p.stderr.strip()
    print(f"$ {' '.join(args)}\nexit status {p.returncode}\nstderr: {err}\nstdout: {p.stdout.strip()}")
    failures = []
    if p.returncode != 1:
        failures.append(f"exit status {p.returncode}, expected 1")
    program = os.path.basename(trainer)
    if not err.startswith(program + ": "):
        failures.append("the error does not start with the program's name")
    if "no CUDA device" in err:
        if "--device cuda" not in err:
            failures.append("the no-device error does not name --device cuda")
        if "(" not in err or "cuda" not in err.lower():
            failures.append("the no-device error does not say what the CUDA runtime answered")
        if p.stdout.strip():
            failures.append("something was printed (training started?) before the no-device error")
        print("no CUDA device here: the trainer refused at once, as it must")
    elif "no CUDA support" in err:
        print("a build without CUDA: the trainer said so")
    elif missing in err:
        print("a CUDA device is present: the trainer got past the device check and reported the missing data")
    else:
        failures.append("the error names neither the missing CUDA device nor the missing data")
    for f in failures:
        print("FAIL:", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
