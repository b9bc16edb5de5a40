"""Example 03 (libtorch_ddp) started by a launcher as one of several processes refuses (exit 2),
naming the launcher and advising --ranks N, instead of running one complete job per process; a
launcher that started one process is no reason to refuse (that run stops at a missing data
directory instead, exit 1, so this needs no dataset).

usage: check_libtorch_ddp_refusal.py EXE
"""
import os
import subprocess
import sys

exe = sys.argv[1]
LAUNCHER_VARIABLES = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_STEP_NUM_TASKS", "TORCHELASTIC_RUN_ID", "WORLD_SIZE")
failures = []


def run(extra_env):
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARIABLES}
    env.update(extra_env)
    return subprocess.run([exe, "--epochs", "1", "--data", "/nonexistent-ringzero-data"], env=env,
                          capture_output=True, text=True, timeout=60)


for extra, launcher in (({"OMPI_COMM_WORLD_SIZE": "2"}, "mpirun (Open MPI) as one of 2 processes"),
                        ({"PMI_SIZE": "2"}, "mpiexec (PMI) as one of 2 processes"),
                        ({"SLURM_STEP_NUM_TASKS": "2"}, "srun (Slurm) as one of 2 processes"),
                        ({"TORCHELASTIC_RUN_ID": "x", "WORLD_SIZE": "2"}, "torchrun as one of 2 processes")):
    r = run(extra)
    if r.returncode != 2 or launcher not in r.stderr or "--ranks 2" not in r.stderr:
        failures.append(f"{extra}: exit {r.returncode}, stderr {r.stderr.strip()!r}; expected exit 2 naming "
                        f"{launcher!r} and --ranks 2")
for extra in ({"OMPI_COMM_WORLD_SIZE": "1"}, {"WORLD_SIZE": "2"}, {}):
    r = run(extra)
    if r.returncode != 1 or "started by" in r.stderr or "nonexistent-ringzero-data" not in r.stderr:
        failures.append(f"{extra}: exit {r.returncode}, stderr {r.stderr.strip()!r}; expected exit 1 at the missing dataset")

for f in failures:
    print("FAIL:", f)
print(f"{'ok' if not failures else 'FAILED'}: launcher checks of {os.path.basename(exe)}")
sys.exit(1 if failures else 0)
