#!/usr/bin/env python3
"""Python's safetensors package reads every shard file of a ringzero checkpoint, and the
fragments it returns, placed at the global ranges the index records, give every parameter's
values bit for bit (as the model read them back). Python's safetensors and numpy come from the
virtual environment tests/python_safetensors.py makes under BUILD_DIR (argument 2), shared with
the ringzero-ckpt checks.

usage: check_safetensors.py FIXTURE BUILD_DIR
Exit status: 0, 1 on a failed check, 77 (skipped) when the environment cannot be made.
"""
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from python_safetensors import safetensors_python  # noqa: E402


CHECK = r'''
import json, os, sys
import numpy as np
from safetensors.numpy import load_file
from safetensors import safe_open
root = sys.argv[1]
d = os.path.join(root, "python")
index = json.load(open(os.path.join(d, "index.json")))
expected = json.load(open(os.path.join(root, "expected.json")))
files = [load_file(os.path.join(d, f["name"])) for f in index["files"]]
for f in index["files"]:
    with safe_open(os.path.join(d, f["name"]), framework="numpy") as h:
        meta = h.metadata()
        assert meta["format"] == "ringzero.checkpoint" and meta["rank"] == str(f["rank"]), meta
checked = 0
for t in index["tensors"]:
    if t["role"] != "parameter":
        # optimizer states and masters are readable too: shapes and dtypes as recorded
        for fr in t["fragments"]:
            b, e = fr["range"]
            key = "%s#%s[%d:%d]" % (t["name"], "state%d" % t["state"] if t["role"] == "optimizer_state" else t["role"], b, e)
            a = files[fr["file"]][key]
            assert a.shape == (e - b,) and a.dtype == np.float32, (key, a.shape, a.dtype)
        continue
    n = int(np.prod(t["shape"])) if t["shape"] else 1
    source = t
    if "tied_to" in t:
        source = next(s for s in index["tensors"] if s["name"] == t["tied_to"] and s["role"] == "parameter")
    full = np.zeros(n, dtype=np.float32)
    for fr in source["fragments"]:
        b, e = fr["range"]
        full[b:e] = files[fr["file"]]["%s#parameter[%d:%d]" % (source["name"], b, e)]
    want = np.array(expected[t["name"]], dtype=np.uint32)
    got = full.view(np.uint32)
    assert got.shape == want.shape and (got == want).all(), (t["name"], got[:4], want[:4])
    full.reshape(t["shape"])  # the recorded global shape fits the values
    checked += 1
assert checked == len(expected), (checked, len(expected))
print("safetensors read %d shard files; %d parameters equal the model's values bit for bit" % (len(files), checked))
'''


def main():
    fixture, build_dir = sys.argv[1], sys.argv[2]
    python = safetensors_python(build_dir)
    if python is None:
        print("SKIP: Python's safetensors package is not available")
        return 77
    with tempfile.TemporaryDirectory(prefix="ringzero-ckpt-python-") as root:
        subprocess.run([fixture, "python", root], check=True)
        return subprocess.run([python, "-c", CHECK, root]).returncode


if __name__ == "__main__":
    sys.exit(main())
