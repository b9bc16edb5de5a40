#!/usr/bin/env python3
"""Runs ringzero-plan and checks its JSON and its errors (meson passes the program's path)."""
import json
import os
import subprocess
import sys
import tempfile

tool = sys.argv[1]
failures = []


def run(*args):
    return subprocess.run([tool, *args], capture_output=True, text=True)


def check(condition, what):
    if not condition:
        failures.append(what)


def plans(*args):
    r = run(*args, "--json")
    check(r.returncode == 0, f"{args}: exit {r.returncode}: {r.stderr}")
    return json.loads(r.stdout)


# GPT-2 small: the published parameter count; the paper's model reproduced with mixed precision.
out = plans("--model", "gpt2", "--world-size", "4")
check(out["model"]["parameters"] == 124439808, "gpt2 parameter count")
check([p["stage"] for p in out["plans"]] == [0, 1, 2, 3], "--stage all gives four plans")
psi = 124439808
for p in out["plans"]:
    paper = p["paper"]["model_states"]["total"]
    n = 4
    expected = [16 * psi, 4 * psi + 12 * psi / n, 2 * psi + 14 * psi / n, 16 * psi / n][p["stage"]]
    check(abs(paper - expected) < 1e-6 * expected, f"stage {p['stage']} paper formula {paper} vs {expected}")
    # the plan differs from the paper only by padding
    states = p["memory_per_rank"]["model_states"]
    check(abs(states - expected - p["paper"]["padding_bytes"]) < 1e-3, f"stage {p['stage']} padding accounts for the difference")

# Fits / does not fit.
big = plans("--model", "llama-7b", "--world-size", "8", "--stage", "0", "--gpu-memory", "80GB")
check(big["plans"][0]["fits"] is False, "llama-7b stage 0 does not fit in 80 GB")
small = plans("--model", "llama-7b", "--world-size", "64", "--stage", "3", "--gpu-memory", "80GB")
check(small["plans"][0]["fits"] is True, "llama-7b stage 3 on 64 GPUs fits in 80 GB")

# Thousands of ranks and hybrid sharding.
huge = plans("--model", "gpt2-xl", "--world-size", "4096", "--replica-group-size", "256", "--stage", "3")
p = huge["plans"][0]
check(p["shards"] == 256 and p["replica_groups"] == 16, "hybrid groups")
check(any(t["group"] == "replica group" for t in p["traffic_per_step"]), "replica all_reduce listed")

# A model file with dtypes, a frozen parameter, a tie and units; --show-rank lists fragments.
model = [
    {"name": "embed", "shape": [100, 8], "unit": "embed", "tie": "e"},
    {"name": "w", "shape": [8, 8], "dtype": "float32", "unit": "block"},
    {"name": "frozen", "shape": [7], "trainable": False, "unit": "block"},
    {"name": "out", "shape": [100, 8], "unit": "head", "tie": "e"},
]
with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
    json.dump({"parameters": model}, f)
    path = f.name
try:
    out = plans("--model-file", path, "--world-size", "2", "--stage", "3", "--show-rank", "1")
    check(out["model"]["parameters"] == 800 + 64 + 7, "model file parameter count (tie counted once)")
    check(out["model"]["trainable"] == 864, "frozen parameter excluded from trainable")
    frags = out["plans"][0]["rank"]["fragments"]
    check(sum(f["count"] for f in frags) > 0 and all(f["parameter"] != "out" for f in frags), "fragments of rank 1")
    bad = run("--model-file", path, "--world-size", "3", "--replica-group-size", "2")
    check(bad.returncode == 1 and "does not divide world size 3" in bad.stderr, "bad group size refused")
finally:
    os.unlink(path)

# Bad requests: clear errors, exit status 1 (2 for command-line usage).
r = run("--model", "gpt2", "--world-size", "4", "--alignment", "24")
check(r.returncode == 1 and "alignment must be a power of two" in r.stderr, "bad alignment refused")
r = run("--model", "gpt5", "--world-size", "4")
check(r.returncode == 1 and "unknown model 'gpt5'" in r.stderr, "unknown model refused")
r = run("--model", "gpt2", "--world-size", "4", "--param-dtype", "float12")
check(r.returncode == 1 and "unknown parameter dtype 'float12'" in r.stderr, "unknown dtype refused")
r = run("--model", "gpt2", "--world-size", "0")
check(r.returncode != 0, "world size 0 refused")
r = run("--model", "gpt2", "--world-size", "4", "--gpu-memory", "80 parsecs")
check(r.returncode == 1 and "unknown size unit" in r.stderr, "bad size refused")
r = run("--model", "gpt2", "--world-size", "4", "--gpu-memory", "80")
check(r.returncode == 1 and "reads as 80 bytes; give a unit" in r.stderr, "unitless small GPU memory refused")
r = run("--model", "gpt2", "--world-size", "4", "--gpu-memory", "85899345920")
check(r.returncode == 0, "a byte count of GPU memory accepted")
with tempfile.TemporaryDirectory() as d:
    empty = os.path.join(d, "empty.json")
    with open(empty, "w") as f:
        f.write('{"parameters": []}')
    r = run("--model-file", empty, "--world-size", "4")
    check(r.returncode == 1 and "lists no parameters" in r.stderr, "model file without parameters refused")

# Text output names the categories and the verdict.
r = run("--model", "gpt2-medium", "--world-size", "16", "--stage", "2", "--gpu-memory", "16GiB")
check(r.returncode == 0 and "optimizer states" in r.stdout and "fits in 16.00 GiB: yes" in r.stdout, "text report")

for f in failures:
    print("FAIL:", f)
sys.exit(1 if failures else 0)
