"""Examples 01 and 02 started by a launcher as one of several processes, without --backend mpi,
refuse (exit 2) with a message naming the launcher and --backend mpi (torchrun: --ranks N), instead of running one complete job per
process. The launcher is simulated by the variables it sets (Open MPI, PMI, Slurm's srun,
torchrun); a launcher that started one process, and a batch script's Slurm variables, are no
reason to refuse (those runs stop at a bad option instead, so they need no dataset).

usage: check_launcher_refusal.py DDP_EXE ZERO_EXE
"""
import os
import subprocess
import sys

ddp_exe, zero_exe = sys.argv[1], sys.argv[2]
LAUNCHER_VARIABLES = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_STEP_NUM_TASKS", "TORCHELASTIC_RUN_ID", "WORLD_SIZE")
failures = []


def run(exe, args, extra_env):
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARIABLES}
    env.update(extra_env)
    return subprocess.run([exe, *args], env=env, capture_output=True, text=True, timeout=60)


def expect_refusal(exe, extra_env, launcher, advice):
    r = run(exe, ["--epochs", "1"], extra_env)
    name = os.path.basename(exe)
    if r.returncode != 2 or launcher not in r.stderr or advice not in r.stderr:
        failures.append(f"{name} {extra_env}: exit {r.returncode}, stderr {r.stderr.strip()!r}; "
                        f"expected exit 2 naming {launcher!r} and {advice!r}")


def expect_no_refusal(exe, extra_env):
    # A data directory that does not exist: the run passes the launcher check and stops when it
    # opens the dataset (exit 1, naming the file), so this needs no dataset.
    r = run(exe, ["--epochs", "1", "--data", "/nonexistent-ringzero-data"], extra_env)
    name = os.path.basename(exe)
    if r.returncode != 1 or "started by" in r.stderr or "nonexistent-ringzero-data" not in r.stderr:
        failures.append(f"{name} {extra_env}: exit {r.returncode}, stderr {r.stderr.strip()!r}; expected exit 1 at the missing dataset")


for exe, advice in ((ddp_exe, "--backend mpi"), (zero_exe, "--backend mpi")):
    expect_refusal(exe, {"OMPI_COMM_WORLD_SIZE": "4"}, "mpirun (Open MPI) as one of 4 processes", advice)
    expect_refusal(exe, {"PMI_SIZE": "4"}, "mpiexec (PMI) as one of 4 processes", advice)
    expect_refusal(exe, {"SLURM_STEP_NUM_TASKS": "4"}, "srun (Slurm) as one of 4 processes", advice)
    expect_refusal(exe, {"TORCHELASTIC_RUN_ID": "x", "WORLD_SIZE": "4"}, "torchrun as one of 4 processes", "--ranks 4")
    expect_no_refusal(exe, {"OMPI_COMM_WORLD_SIZE": "1"})
    expect_no_refusal(exe, {"WORLD_SIZE": "4"})  # WORLD_SIZE alone is not torchrun
    expect_no_refusal(exe, {"SLURM_NTASKS": "4", "SLURM_PROCID": "0"})  # a batch script, not srun
    expect_no_refusal(exe, {})
# Example 02 also runs one rank per process and GPU: every refusal says how.
for env in ({"OMPI_COMM_WORLD_SIZE": "4"}, {"TORCHELASTIC_RUN_ID": "x", "WORLD_SIZE": "4"}):
    expect_refusal(zero_exe, env, "as one of 4 processes", "On GPUs, pass --backend nccl --device cuda")

for f in failures:
    print("FAIL:", f)
print(f"{'ok' if not failures else 'FAILED'}: launcher checks of {os.path.basename(ddp_exe)} and {os.path.basename(zero_exe)}")
sys.exit(1 if failures else 0)
