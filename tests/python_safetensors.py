"""Python's safetensors package (Hugging Face's reference reader) for the checks that read
checkpoint files with it: a virtual environment under the build directory, made once with
`python3 -m venv` (Debian's python3-venv; scripts/install_deps.sh installs it) and `pip install
safetensors numpy`, reused by later runs and shared by concurrent ones (a lock file). Every check
that needs the package (tests/checkpoint, tests/tools) uses this one environment.

Use: sys.path.insert(0, <tests folder>); from python_safetensors import safetensors_python.
"""
import fcntl
import os
import subprocess
import sys


def safetensors_python(build_dir):
    """The python3 of a virtual environment under `build_dir` that imports safetensors and numpy,
    or None (with the reason printed) when it cannot be made (no python3-venv, no network for pip)."""
    venv = os.environ.get("RINGZERO_SAFETENSORS_VENV") or os.path.join(build_dir, "python-safetensors-venv")
    python = os.path.join(venv, "bin", "python3")
    os.makedirs(os.path.dirname(os.path.abspath(venv)), exist_ok=True)
    with open(venv + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if os.path.exists(python) and subprocess.run([python, "-c", "import safetensors, numpy"]).returncode == 0:
            return python
        steps = [[sys.executable, "-m", "venv", venv], [python, "-m", "pip", "install", "--quiet", "safetensors", "numpy"]]
        for step in steps:
            p = subprocess.run(step, capture_output=True, text=True, timeout=600)
            if p.returncode != 0:
                print(f"cannot make the safetensors environment: {' '.join(step)} exited {p.returncode}: {p.stderr.strip()[-800:]}")
                return None
    return python
