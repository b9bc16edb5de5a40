#!/usr/bin/env python3
"""docs/gpu.md's commands that build example 02 for GPUs without Meson work exactly as written.

usage: check_gpu_example_build.py SOURCE_ROOT

Takes the shell block of docs/gpu.md that starts with `mkdir -p build-cuda`, runs it with bash
(-e: every command must succeed) in a scratch directory holding the tree's include/, cuda/ and
examples/ (the block is written for the repository root), and starts the program it built:
`--device cuda` must exit 1 saying "no CUDA device" where there is none (on a machine with a GPU
it must train one small epoch), and `--device cpu --precision bfloat16` must train one small
epoch when Debian's dataset-fashion-mnist is installed.
"""
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from command_check import check, run, finish  # noqa: E402

DATA = "/usr/share/datasets/fashion-mnist"
SMALL = ["--epochs", "1", "--train-subset", "1000", "--test-subset", "500", "--no-progress", "--stage", "3",
         "--precision", "bfloat16"]


def main() -> int:
    source = os.path.abspath(sys.argv[1])
    doc = open(os.path.join(source, "docs", "gpu.md")).read()
    blocks = [b for b in re.findall(r"```sh\n(.*?)```", doc, re.S) if b.startswith("mkdir -p build-cuda\n")]
    if not check(len(blocks) == 1, f"docs/gpu.md has {len(blocks)} blocks starting with 'mkdir -p build-cuda', not 1"):
        return finish()
    with tempfile.TemporaryDirectory(prefix="ringzero-gpu-doc-") as tmp:
        for part in ("include", "cuda", "examples"):
            os.symlink(os.path.join(source, part), os.path.join(tmp, part))
        print("$ (in a copy of the tree) bash -e <<'EOF'\n" + blocks[0] + "EOF", flush=True)
        p = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", blocks[0]], cwd=tmp, capture_output=True, text=True,
                           timeout=900)
        print(p.stdout[-3000:], p.stderr[-3000:])
        if not check(p.returncode == 0, f"the documented build exited with status {p.returncode}"):
            return finish()
        program = os.path.join(tmp, "build-cuda", "zero_fashion_mnist")
        have_data = os.path.exists(os.path.join(DATA, "train-images-idx3-ubyte.gz"))
        p = run(program, "--device", "cuda", *SMALL, timeout=300)
        if "no CUDA device" in p.stderr:
            check(p.returncode == 1, f"--device cuda without a GPU: exit status {p.returncode}, not 1")
        elif have_data:
            check(p.returncode == 0, f"--device cuda on a GPU: exit status {p.returncode}")
        else:  # a GPU but no dataset: the data loader's refusal, naming the dataset
            check(p.returncode == 1 and "cannot open IDX file" in p.stderr,
                  f"--device cuda without the dataset: exit status {p.returncode}")
        if have_data:
            p = run(program, "--device", "cpu", "--ranks", "2", *SMALL, timeout=300)
            check(p.returncode == 0 and "final parameters crc32" in p.stdout,
                  f"--device cpu --precision bfloat16: exit status {p.returncode}")
    return finish()


if __name__ == "__main__":
    sys.exit(main())
