#!/usr/bin/env python3
"""The DDP example under MPI computes what it computes on the local backend.

Usage: mpi_matches_local.py EXAMPLE MPIRUN [MPIRUN_ARGS...] -- [EXAMPLE_ARGS...]

Trains once with `--backend local --ranks 2` and once as `MPIRUN -np 2 EXAMPLE --backend mpi`,
with the same seed, data and batch, and requires every epoch's training loss, test loss and test
accuracy to be identical. With 2 ranks they must be bit for bit: every element of an averaged
gradient is (a + b) / 2 whichever algorithm and backend add it, and IEEE addition commutes.
The final parameters' CRC-32 (which the example records for CPU runs) must agree too; with
--reproducible --micro-batch that holds for any rank count and algorithm.
"""
import json
import os
import subprocess
import sys
import tempfile


def main() -> int:
    example, mpirun = sys.argv[1], sys.argv[2]
    split = sys.argv.index("--")
    mpirun_args, example_args = sys.argv[3:split], sys.argv[split + 1:]
    with tempfile.TemporaryDirectory() as tmp:
        local_json = os.path.join(tmp, "local.json")
        mpi_json = os.path.join(tmp, "mpi.json")
        runs = {
            "local": [example, "--backend", "local", "--ranks", "2", "--json", local_json] + example_args,
            "mpi": [mpirun] + mpirun_args + ["-np", "2", example, "--backend", "mpi", "--json", mpi_json] + example_args,
        }
        for name, cmd in runs.items():
            print("$", " ".join(cmd), flush=True)
            done = subprocess.run(cmd, timeout=240)
            if done.returncode != 0:
                print(f"FAIL: the {name} run exited with status {done.returncode}")
                return 1
        local = json.load(open(local_json))["runs"][0]
        mpi = json.load(open(mpi_json))["runs"][0]
    if mpi["ranks"] != 2 or local["ranks"] != 2:
        print(f"FAIL: expected 2 ranks in both runs, got local {local['ranks']} and mpi {mpi['ranks']}")
        return 1
    if len(local["epochs"]) != len(mpi["epochs"]) or not local["epochs"]:
        print("FAIL: the runs trained different numbers of epochs")
        return 1
    bad = 0
    for a, b in zip(local["epochs"], mpi["epochs"]):
        for key in ("train_loss", "test_loss", "test_accuracy"):
            if a[key] != b[key]:
                print(f"FAIL: epoch {a['epoch']} {key}: local {a[key]!r} but mpi {b[key]!r}")
                bad += 1
        print(f"epoch {a['epoch']}: train loss {a['train_loss']:.6f}, test accuracy {a['test_accuracy']:.4f} on both backends")
    if local.get("parameter_crc32") != mpi.get("parameter_crc32"):
        print(f"FAIL: final parameters' CRC-32: local {local.get('parameter_crc32')} but mpi {mpi.get('parameter_crc32')}")
        bad += 1
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
