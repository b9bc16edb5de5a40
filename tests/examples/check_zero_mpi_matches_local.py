#!/usr/bin/env python3
"""Example 02 under MPI computes what it computes on the local backend, at every stage.

Usage: check_zero_mpi_matches_local.py EXAMPLE MPIRUN [MPIRUN_ARGS...] -- [EXAMPLE_ARGS...]

For stages 0-3: trains once with `--backend local --ranks 2` and once as
`MPIRUN -np 2 EXAMPLE --backend mpi`, with the same seed, data and batch, and requires every
epoch's training loss, test loss and test accuracy and the final parameters (--save-parameters)
to be the same bits, and the measured memory of both ranks to be the plan's. With 2 ranks every
reduced element is a + b (or its mean) whichever backend adds it, and IEEE addition commutes.
Also: `--ranks 3` under `-np 2` is refused (exit 1, naming --ranks 3).
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
    bad = []
    with tempfile.TemporaryDirectory() as tmp:
        for stage in range(4):
            out = {}
            for name in ("local", "mpi"):
                js = os.path.join(tmp, f"{name}{stage}.json")
                params = os.path.join(tmp, f"{name}{stage}.f32")
                args = ["--stage", str(stage), "--json", js, "--save-parameters", params] + example_args
                if name == "local":
                    cmd = [example, "--backend", "local", "--ranks", "2"] + args
                else:
                    cmd = [mpirun] + mpirun_args + ["-np", "2", example, "--backend", "mpi"] + args
                print("$", " ".join(cmd), flush=True)
                done = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
                if done.returncode != 0:
                    print(done.stdout, done.stderr)
                    bad.append(f"stage {stage}: the {name} run exited with status {done.returncode}")
                    break
                out[name] = (json.load(open(js)), open(params, "rb").read())
            if len(out) != 2:
                continue
            (local, local_params), (mpi, mpi_params) = out["local"], out["mpi"]
            if mpi["config"]["ranks"] != 2 or mpi["config"]["backend"] != "mpi":
                bad.append(f"stage {stage}: the MPI run reports {mpi['config']['ranks']} ranks on {mpi['config']['backend']}")
            if len(local["epochs"]) != len(mpi["epochs"]) or not local["epochs"]:
                bad.append(f"stage {stage}: the runs trained different numbers of epochs")
            for a, b in zip(local["epochs"], mpi["epochs"]):
                for key in ("train_loss", "test_loss", "test_accuracy", "gradient_norm"):
                    if a[key] != b[key]:
                        bad.append(f"stage {stage} epoch {a['epoch']} {key}: local {a[key]!r} but mpi {b[key]!r}")
            if local_params != mpi_params or not local_params:
                bad.append(f"stage {stage}: the final parameters differ ({len(local_params)} and {len(mpi_params)} bytes)")
            planned = mpi["plan"]["memory"]["total"]
            measured = [r["measured"]["total"] for r in mpi["memory"]]
            if measured != [planned, planned]:
                bad.append(f"stage {stage}: MPI ranks' measured memory {measured}, planned {planned} each")
            last = mpi["epochs"][-1] if mpi["epochs"] else {}
            print(f"stage {stage}: train loss {last.get('train_loss')!r}, test accuracy {last.get('test_accuracy')!r} "
                  f"on both backends; parameters {'equal' if local_params == mpi_params else 'DIFFERENT'}")
        refused = subprocess.run([mpirun] + mpirun_args + ["-np", "2", example, "--backend", "mpi", "--ranks", "3"]
                                 + example_args, capture_output=True, text=True, timeout=120)
        if refused.returncode != 1 or "--ranks 3" not in refused.stderr:
            bad.append(f"--ranks 3 under -np 2: exit {refused.returncode}, stderr {refused.stderr.strip()!r}")
    for b in bad:
        print("FAIL:", b)
    print("ok" if not bad else "FAILED")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
