#!/usr/bin/env python3
"""Runs ringzero-plan and checks its JSON and its errors (meson passes the program's path)."""
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from command_check import check, finish, run as run_program  # noqa: E402

tool = sys.argv[1]


def run(*args, timeout=120):
    return run_program(tool, *args, timeout=timeout)


def plans(*args, timeout=120):
    r = run(*args, "--json", timeout=timeout)
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
    # --keep-frozen: the frozen [7] (float16 by the mixed precision: 7 elements padded to 16 on 2
    # ranks of 16-byte alignment, 32 B) held whole; the gathers lose its 32 B per gather, the
    # parameter memory gains the other half (16 B). A budget under 32 B keeps nothing.
    plain = plans("--model-file", path, "--world-size", "2", "--stage", "3")["plans"][0]
    kept = plans("--model-file", path, "--world-size", "2", "--stage", "3", "--keep-frozen", "all")["plans"][0]
    small = plans("--model-file", path, "--world-size", "2", "--stage", "3", "--keep-frozen", "31")["plans"][0]
    check(plain["frozen"]["gathered_on_demand_bytes"] == 32 and plain["frozen"]["kept_gathered_bytes"] == 0,
          f"frozen on demand by default: {plain['frozen']}")
    check(kept["frozen"]["kept_gathered_bytes"] == 32 and kept["frozen"]["buffers"][0]["unit"] == "block",
          f"--keep-frozen all: {kept['frozen']}")
    check(small["frozen"] == plain["frozen"], "--keep-frozen 31 keeps nothing")
    gathers = lambda p: sum(t["bytes"] for t in p["traffic_per_step"] if t["collective"] == "all_gather")
    check(gathers(plain) - gathers(kept) == 2 * 32, "--keep-frozen: the frozen buffer's two gathers gone")
    check(kept["memory_per_rank"]["parameters"] - plain["memory_per_rank"]["parameters"] == 16,
          "--keep-frozen: the frozen buffer held whole")
    text = run("--model-file", path, "--world-size", "2", "--stage", "3", "--keep-frozen", "all")
    check("frozen parameters: 32 B kept gathered" in text.stdout, f"text names the kept bytes: {text.stdout}")
    bad = run("--model-file", path, "--world-size", "2", "--keep-frozen", "lots")
    check(bad.returncode == 1 and "--keep-frozen" in bad.stderr, f"bad --keep-frozen refused: {bad.stderr}")
finally:
    os.unlink(path)

# --reshard-after-forward (stage 3): except_last saves the last unit's second gather at no memory;
# none gathers each unit once per micro-batch and holds every unit at the end of the forward.
def stage3(policy):
    p = plans("--model", "gpt2", "--world-size", "4", "--stage", "3", "--accumulation-steps", "2",
              "--reshard-after-forward", policy)["plans"][0]
    check(p["reshard_after_forward"] == policy, f"{policy}: reported")
    calls = {t["purpose"]: t["calls"] for t in p["traffic_per_step"] if t["collective"] == "all_gather"}
    return p, calls.get("parameters before forward", 0), calls.get("parameters before backward", 0)


every, every_fwd, every_bwd = stage3("all")
last, last_fwd, last_bwd = stage3("except_last")
never, never_fwd, never_bwd = stage3("none")
check(every_fwd == last_fwd and every_bwd > 0, "all and except_last gather the same before forward")
# gpt2 ties the head to the embeddings: the last unit's backward gathers both units (2 buffers),
# once per micro-batch (2), and except_last keeps them from its forward.
check(every_bwd - last_bwd == 2 * 2, f"except_last skips the last unit's second gather: {every_bwd} vs {last_bwd}")
check(never_fwd == every_fwd - 2, "none: the embeddings stay gathered for the tied head")
check(never_bwd == 0, "none: no gather before backward")
eb, lb, nb = (x["communication_buffers"]["gather_buffers"] for x in (every, last, never))
check(lb == eb, f"except_last holds no more gather buffers than all ({lb} vs {eb})")
check(nb > eb, f"none holds every unit at the end of the forward ({nb} vs {eb})")
check(never["memory_per_rank"]["total"] > every["memory_per_rank"]["total"], "none costs memory")
r = run("--model", "gpt2", "--world-size", "4", "--reshard-after-forward", "sometimes")
check(r.returncode == 1 and "--reshard-after-forward must be all, except_last or none, got 'sometimes'" in r.stderr,
      f"bad policy refused: {r.stderr!r}")

# --max-inflight-gathers (stage 3): 1 gathers nothing ahead, so fewer gather buffers than the
# default (the tied head's backward still holds two units); --space is reported.
bounded = plans("--model", "gpt2", "--world-size", "4", "--stage", "3", "--accumulation-steps", "2",
                "--max-inflight-gathers", "1", "--space", "device")["plans"][0]
check(bounded["max_inflight_gathers"] == 1 and every["max_inflight_gathers"] == 0, "--max-inflight-gathers reported")
bb = bounded["communication_buffers"]["gather_buffers"]
check(bb == 2 and bb < eb, f"a bound of 1 holds the tied pair only ({bb} vs {eb} without)")
check(bounded["space"] == "device" and every["space"] == "host", "--space reported (host when not given)")
r = run("--model", "gpt2", "--world-size", "4", "--space", "pinned")
check(r.returncode == 1 and "--space must be host or device, got 'pinned'" in r.stderr, f"bad space: {r.stderr!r}")

# Bad requests: clear errors, exit status 1 (2 for command-line usage).
r = run("--model", "gpt2", "--world-size", "4", "--alignment", "24")
check(r.returncode == 1 and "alignment must be a power of two" in r.stderr, "bad alignment refused")
r = run("--model", "gpt5", "--world-size", "4")
check(r.returncode == 1 and "unknown model 'gpt5'" in r.stderr and "--model-file PATH" in r.stderr, "unknown model refused")
r = run("--model", "gpt2", "--world-size", "4", "--param-dtype", "float12")
check(r.returncode == 1 and "unknown parameter dtype 'float12'" in r.stderr, "unknown dtype refused")
# Values CLI11 refuses (out of range, not a number) are bad option values too: status 1 (docs/zero.md);
# unknown and missing options keep CLI11's statuses.
for args in (["--world-size", "0"], ["--world-size", "16777217"], ["--world-size", "four"]):
    r = run("--model", "gpt2", *args)
    check(r.returncode == 1 and "--world-size" in r.stderr, f"{args}: exit {r.returncode}, stderr {r.stderr!r}")
r = run("--model", "gpt2", "--world-size", "4", "--no-such-option")
check(r.returncode == 109, f"unknown option: exit {r.returncode}")
r = run("--model", "gpt2")
check(r.returncode == 106, f"missing --world-size: exit {r.returncode}")
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


def refused(args, message, what):
    """`args` exit with status 1 and `message` in the error."""
    r = run(*args)
    check(r.returncode == 1 and message in r.stderr, f"{what}: exit {r.returncode}, stderr {r.stderr!r}")


# Sums that overflow 64 bits are refused, naming the figure (not wrapped: stage 3 used to print a
# total smaller than the model states, and 0 B of traffic; stage 0 used to print 0 B).
with tempfile.TemporaryDirectory() as d:
    def model_file(name, params):
        path = os.path.join(d, name)
        with open(path, "w") as f:
            f.write(params if isinstance(params, str) else json.dumps(params))
        return path

    sumovf = model_file("sumovf.json", [{"name": f"p{i}", "shape": [2**59], "dtype": "float32", "unit": f"u{i}"}
                                        for i in range(8)])
    refused(["--model-file", sumovf, "-n", "4", "--stage", "3"],
            "zero::shard_plan: the total memory per rank overflows 64 bits", "8 x 2^59 float32, stage 3")
    refused(["--model-file", sumovf, "-n", "4", "--stage", "0", "--json"],
            "zero::shard_plan: the optimizer state memory per rank overflows 64 bits", "8 x 2^59 float32, stage 0")
    big40 = model_file("big40.json", [{"name": "p0", "shape": [2**40], "dtype": "float32", "unit": "u0"}])
    refused(["--model-file", big40, "-n", "4", "--stage", "3", "--accumulation-steps", "2147483647"],
            "the all_gather traffic per step (parameters before forward) in elements overflows 64 bits",
            "2^40 elements times 2^31 - 1 micro-batches")
    out = plans("--model-file", big40, "-n", "4", "--stage", "2", "--precision", "fp32",
                "--accumulation-steps", str(2**22 - 1))
    gradients = out["plans"][0]["traffic_per_step"][0]
    check(gradients["elements"] == (2**22 - 1) * 2**40 and gradients["bytes"] == 2**64 - 2**42,
          f"the largest reduce_scatter traffic that fits is exact: {gradients}")
    # The text table keeps its cells apart when a value is wider than its column.
    r = run("--model-file", big40, "-n", "4", "--stage", "3", "--accumulation-steps", "1000000")
    rows = [line.split() for line in r.stdout.splitlines() if line.startswith("  all_gather ")]
    check(len(rows) == 2 and all(row[-6] == "1000000" and row[-5] == "1,099,511,627,776,000,000" for row in rows),
          f"wide traffic cells run together: {rows}")

    # The model file: anything but a regular file is refused at once (a FIFO used to block).
    fifo = os.path.join(d, "fifo.json")
    os.mkfifo(fifo)
    try:
        refused(["--model-file", fifo, "-n", "4"], f"model file '{fifo}' is not a regular file", "a FIFO")
    except subprocess.TimeoutExpired:
        check(False, "a FIFO as model file blocks")
    refused(["--model-file", "/dev/zero", "-n", "4"], "model file '/dev/zero' is not a regular file", "/dev/zero")
    refused(["--model-file", d, "-n", "4"], f"model file '{d}' is not a regular file", "a directory")
    refused(["--model-file", os.path.join(d, "missing.json"), "-n", "4"], "cannot open model file", "a missing file")
    badtype = model_file("badtype.json", [{"name": "a", "shape": [3], "dtype": "float128"}])
    refused(["--model-file", badtype, "-n", "4"],
            f"error: model file '{badtype}', parameter 0 ('a'): unknown dtype 'float128' (float32, ", "an unknown dtype")
    dupkey = model_file("dupkey.json", '[{"name": "a", "shape": [3], "name": "b"}]')
    refused(["--model-file", dupkey, "-n", "4"], f"model file '{dupkey}' gives the key 'name' twice in one object",
            "a key given twice")
    nested = model_file("nested.json", '{"parameters": [{"name": "a", "shape": [3]}], "parameters": []}')
    refused(["--model-file", nested, "-n", "4"], "gives the key 'parameters' twice in one object", "a top-level key twice")
    same_keys = model_file("same_keys.json", [{"name": "a", "shape": [3]}, {"name": "b", "shape": [3]}])
    check(run("--model-file", same_keys, "-n", "4").returncode == 0, "the same key in different objects accepted")
    inner_dupkey = model_file("inner_dupkey.json", '[{"name": "a", "shape": [3], "x": [{"k": 1, "k": 2}]}]')
    refused(["--model-file", inner_dupkey, "-n", "4"],
            f"model file '{inner_dupkey}' gives the key 'k' twice in one object", "a key twice in a nested object")
    refused(["--model-file", model_file("invalid.json", '[{"name": "a", "shape": [3]},]'), "-n", "4"],
            "is not valid JSON: [json.exception.parse_error.101]", "invalid JSON")

    # Nesting: 100,000 brackets under an unknown key crashed it (SIGSEGV: the message dumped the
    # value recursively, 140 KB of it at depth 70,000). Beyond 64 levels the file is refused before
    # anything recursive runs; a message quotes at most 80 characters of any value from the file.
    def bounded(args, message, what, limit=600):
        r = run(*args)
        check(r.returncode == 1 and r.stderr.startswith("ringzero-plan: error: model file '") and message in r.stderr
              and len(r.stderr) < limit, f"{what}: exit {r.returncode}, {len(r.stderr)} bytes of stderr {r.stderr[:300]!r}")

    def nested(name, depth):
        """A parameter with the unknown key "x" holding `depth` nested lists (the file nests depth + 2 levels)."""
        return model_file(name, '[{"name": "a", "shape": [2], "x": ' + "[" * depth + "]" * depth + "}]")

    deep = nested("deep.json", 100000)
    bounded(["--model-file", deep, "-n", "4"], f"model file '{deep}' nests arrays and objects more than 64 levels deep",
            "100,000 nested lists")
    bounded(["--model-file", nested("depth65.json", 63), "-n", "4"], "more than 64 levels deep", "65 levels")
    bounded(["--model-file", nested("depth64.json", 62), "-n", "4"],
            "unexpected key 'x' or value " + "[" * 62 + "]" * 18 + "...",
            "64 levels: read, the unknown key's value quoted up to 80 characters")
    long = "y" * 1000000
    bounded(["--model-file", model_file("long_value.json", [{"name": "a", "shape": [2], "x": long}]), "-n", "4"],
            "unexpected key 'x' or value \"" + "y" * 79 + "...", "a long value under an unknown key")
    bounded(["--model-file", model_file("long_key.json", [{"name": "a", "shape": [2], long: 1}]), "-n", "4"],
            "unexpected key '" + "y" * 80 + "...' or value 1", "a long unknown key")
    bounded(["--model-file", model_file("long_name.json", [{"name": long, "shape": [2], "dtype": long}]), "-n", "4"],
            "parameter 0 ('" + "y" * 80 + "...'): unknown dtype '" + "y" * 80 + "...'", "a long name and dtype")
    bounded(["--model-file", model_file("long_dupkey.json", '[{"name": "a", "shape": [2], "%s": 1, "%s": 2}]'
                                        % (long, long)), "-n", "4"],
            "gives the key '" + "y" * 80 + "...' twice in one object", "a long key given twice")
    bounded(["--model-file", model_file("unterminated.json", '[{"name": "' + long), "-n", "4"],
            "is not valid JSON: [json.exception.parse_error.101]", "invalid JSON with a long last token")

    # A million parameters: the parse was quadratic (4.7 s for 100,000, 526 s for 1,000,000; now
    # about 2 s in a release build, docs/zero.md). The bound is generous for a loaded machine; the
    # parameter count is exact. Shapes of ~1 Mi elements keep the gather units small.
    count = 1000000
    million = os.path.join(d, "million.json")
    with open(million, "w") as f:
        f.write("[" + ",".join(f'{{"name":"p{i}","shape":[1024,{1024 + i % 3}]}}' for i in range(count)) + "]")
    try:
        out = plans("--model-file", million, "-n", "8", "--stage", "3", timeout=60)
        elements = sum(1024 * (1024 + i % 3) for i in range(count))
        check(out["model"]["tensors"] == count and out["model"]["parameters"] == elements,
              f"a million parameters: {out['model']}, expected {elements} elements")
    except subprocess.TimeoutExpired:
        check(False, "a model file of a million parameters takes more than 60 s")

# Sizes: exact up to 2^64 - 1, refused above, naming the option and the value as given.
for value, expected in [("1e19", 10**19), ("18446744073709551615", 2**64 - 1), ("16777215TiB", (2**24 - 1) * 2**40),
                        ("80GiB", 80 * 2**30), ("1.5GB", 1500000000)]:
    out = plans("--model", "gpt2", "-n", "8", "--stage", "3", "--gpu-memory", value)
    check(out["plans"][0]["gpu_memory"] == expected, f"--gpu-memory {value}: {out['plans'][0]['gpu_memory']} vs {expected}")
for value in ["1e20", "18446744073709551616", "16777216TiB", "1.8446744073709551615e19"]:
    refused(["--model", "gpt2", "-n", "8", "--gpu-memory", value],
            f"--gpu-memory '{value}' does not fit in 64 bits (at most 18446744073709551615 bytes)", f"--gpu-memory {value}")
refused(["--model", "gpt2", "-n", "8", "--unit-bytes", "1e30"], "--unit-bytes '1e30' does not fit in 64 bits", "--unit-bytes 1e30")
refused(["--model", "gpt2", "-n", "8", "--unit-bytes", "-1MiB"], "--unit-bytes '-1MiB' is negative", "--unit-bytes -1MiB")
refused(["--model", "gpt2", "-n", "8", "--unit-bytes", "-0.4"], "--unit-bytes '-0.4' is negative", "--unit-bytes -0.4 (rounds to -0)")
refused(["--model", "gpt2", "-n", "8", "--gpu-memory", "nan"], "--gpu-memory 'nan' is not a finite size", "--gpu-memory nan")
check(run("--model", "gpt2", "-n", "8", "--unit-bytes", "18446744073709551615").returncode == 0, "--unit-bytes 2^64 - 1")

# --alignment: a signed or oversized value is named as given, not wrapped to 2^64 - 16.
refused(["--model", "gpt2", "-n", "4", "--alignment", "-16"],
        "--alignment must be a whole number of bytes (a power of two), got '-16'", "--alignment -16")
refused(["--model", "gpt2", "-n", "4", "--alignment", "18446744073709551616"],
        "--alignment '18446744073709551616' does not fit in 64 bits", "--alignment 2^64")
out = plans("--model", "gpt2", "-n", "4", "--stage", "1", "--alignment", "4096")
check(out["plans"][0]["padding_elements"] > 0, "--alignment 4096 accepted")

# --offload optimizer: device and host memory apart; the 70B preset on 8 x 80 GB fits at stage 3
# only with offload (bf16 parameters and gradients, float32 master weights and Adam states).
for offload in ("none", "optimizer"):
    out = plans("--model", "llama-70b", "--world-size", "8", "--precision", "bf16", "--gpu-memory", "80GB",
                "--offload", offload)
    check(out["model"]["parameters"] == 68976648192, "llama-70b parameter count")
    for p in out["plans"]:
        dev, host, total = p["device_memory_per_rank"], p["host_memory_per_rank"], p["memory_per_rank"]
        check(p["offload"] == offload, "offload reported")
        for k in ("parameters", "gradients", "master_weights", "optimizer_states", "communication_buffers", "total"):
            check(dev[k] + host[k] == total[k], f"{offload} stage {p['stage']}: device + host {k} is the total")
        check(p["fits"] == (dev["total"] <= 80 * 10**9), f"{offload} stage {p['stage']}: fits judges the device part")
        if offload == "none":
            check(host["total"] == 0, "no offload: nothing in host memory")
            check(p["fits"] is False, f"llama-70b stage {p['stage']} without offload does not fit in 80 GB")
        else:
            # the updated range per rank: every (padded) element at stage 0, a shard of 1/8 at stages 1-3
            padded = dev["parameters"] // 2 * (8 if p["stage"] == 3 else 1)
            own = padded if p["stage"] == 0 else padded // 8
            check(host["master_weights"] == 4 * own, f"stage {p['stage']}: float32 master weights of the updated range")
            check(host["optimizer_states"] == 2 * host["master_weights"], "Adam's two float32 states in host memory")
            check(host["communication_buffers"] == host["master_weights"], "transfer buffers: 2 + 2 bytes per element")
            check(dev["master_weights"] == 0 and dev["optimizer_states"] == 0, "nothing of the optimizer on the GPU")
            check(p["fits"] is (p["stage"] == 3), f"llama-70b stage {p['stage']} with offload: fits at stage 3 only")
r = run("--model", "llama-70b", "--world-size", "8", "--precision", "bf16", "--gpu-memory", "80GB", "--stage", "3",
        "--offload", "optimizer")
check(r.returncode == 0 and "in pinned host memory (offload optimizer) 128.48 GiB" in r.stdout
      and "fits in 74.51 GiB: yes" in r.stdout, "the table shows device and host memory and what fits")
r = run("--model", "gpt2", "--world-size", "4", "--offload", "gpu")
check(r.returncode == 1 and "--offload must be none, optimizer or parameters, got 'gpu'" in r.stderr,
      "bad --offload refused")

# --offload parameters (stage 3): the shards in host memory too, the GPU keeps the gather buffers
# and buckets; the host memory per node is the per-rank figure times the ranks per node.
optimizer_offload = plans("--model", "llama-70b", "--world-size", "8", "--precision", "bf16", "--gpu-memory", "80GB",
                          "--stage", "3", "--offload", "optimizer")["plans"][0]
for per_node, expected_per_node in ((None, 8), ("4", 4)):
    args = ["--model", "llama-70b", "--world-size", "8", "--precision", "bf16", "--gpu-memory", "80GB", "--stage", "3",
            "--offload", "parameters"] + (["--ranks-per-node", per_node] if per_node else [])
    p = plans(*args)["plans"][0]
    dev, host, total = p["device_memory_per_rank"], p["host_memory_per_rank"], p["memory_per_rank"]
    check(p["offload"] == "parameters", "offload parameters reported")
    for k in ("parameters", "gradients", "master_weights", "optimizer_states"):
        check(host[k] == total[k] and dev[k] == 0, f"offload parameters: {k} all in host memory")
    check(host["parameters"] == 68976648192 * 2 // 8, "a bfloat16 shard of 1/8 per rank")
    check(host["communication_buffers"] == 0, "no transfer buffers: the CPU updates the shards in place")
    check(dev["total"] == dev["communication_buffers"] == optimizer_offload["device_memory_per_rank"][
        "communication_buffers"], "on the GPU: the gather buffers and buckets of stage 3")
    check(host["total"] == optimizer_offload["memory_per_rank"]["total"] - dev["total"]
          - optimizer_offload["host_memory_per_rank"]["communication_buffers"], "host: the model states")
    check(p["fits"] is True and p["headroom_bytes"] > 60 * 2**30, "70B on 8 x 80 GB fits with room to spare")
    check(p["ranks_per_node"] == expected_per_node, f"ranks per node {expected_per_node}")
    check(p["host_memory_per_node"] == host["total"] * expected_per_node, "host memory per node")
r = run("--model", "llama-70b", "--world-size", "8", "--precision", "bf16", "--gpu-memory", "80GB", "--stage", "3",
        "--offload", "parameters")
check(r.returncode == 0 and "in pinned host memory (offload parameters) 128.48 GiB" in r.stdout
      and "pinned host memory per node (8 ranks per node): 1.00 TiB" in r.stdout and "fits in 74.51 GiB: yes" in r.stdout,
      f"the table shows the offloaded shards, the host memory per node and what fits: {r.stdout}")
refused(["--model", "gpt2", "--world-size", "4", "--offload", "parameters"],
        "--offload parameters plans stage 3 only", "--offload parameters with --stage all")
refused(["--model", "gpt2", "--world-size", "4", "--stage", "2", "--offload", "parameters"],
        "got stage 2: expected stage 3", "--offload parameters at stage 2")
refused(["--model", "gpt2", "--world-size", "4", "--stage", "3", "-g", "2", "--offload", "parameters"],
        "offload::parameters with hybrid sharding (replica group size 2 of world size 4)", "hybrid + parameters")
refused(["--model", "gpt2", "--world-size", "8", "--stage", "3", "--ranks-per-node", "4"],
        "--ranks-per-node counts the pinned host memory per node, which only --offload", "--ranks-per-node alone")

# Quantized communication: int8 blocks of 256 (1 + 4/256 bytes per element) against float16 (2 bytes).
q = plans("--model", "gpt2", "--world-size", "4", "--stage", "3", "--quantize-weights", "int8",
          "--quantize-gradients", "int8")["plans"][0]["traffic_per_step"]
check(len(q) == 3 and all(t["quantized"] == "int8" for t in q), f"every stage-3 collective quantized: {q}")
check([t["collective"] for t in q] == ["all_gather", "all_gather", "all_to_all"], "quantized gradients: all_to_all")
for t in q:
    ratio = t["unquantized_bytes"] / t["bytes"]
    check(abs(ratio - 2 / (1 + 4 / 256)) < 0.01, f"{t['purpose']}: {ratio:.4f}x fewer bytes")
every = plans("--model", "gpt2", "--world-size", "4", "--quantize-weights", "int4", "--quantize-gradients", "int8")
kinds = [[t["quantized"] for t in p["traffic_per_step"]] for p in every["plans"]]
check(kinds[0] == ["none"] and "int4" not in kinds[2] and kinds[3][:2] == ["int4", "int4"],
      f"--stage all keeps each quantization where it applies: {kinds}")
r = run("--model", "gpt2", "--world-size", "4", "--stage", "3", "--quantize-weights", "int8", "--quantization-block",
        "100")
check(r.returncode == 1 and "quantization block size must be a power of two from 8 to 65536, got 100" in r.stderr,
      f"bad block refused: {r.stderr!r}")
r = run("--model", "gpt2", "--world-size", "4", "--stage", "2", "--quantize-weights", "int8")
check(r.returncode == 1 and "quantized weights (int8) need stage 3" in r.stderr, f"weights below stage 3: {r.stderr!r}")
r = run("--model", "gpt2", "--world-size", "4", "--quantize-gradients", "int2")
check(r.returncode == 1 and "--quantize-gradients must be none, int8 or int4, got 'int2'" in r.stderr,
      f"bad width refused: {r.stderr!r}")
r = run("--model", "gpt2", "--world-size", "4", "--stage", "3", "--quantize-weights", "int8")
check(r.returncode == 0 and "(int8)" in r.stdout and "fewer bytes" in r.stdout, "the table marks quantized traffic")

# --accumulate-unsharded: stage 2 with 4 micro-batches reduces like 1 micro-batch, holds stage 1's gradients.
acc = plans("--model", "gpt2", "--world-size", "4", "--stage", "2", "--accumulation-steps", "4")["plans"][0]
uns = plans("--model", "gpt2", "--world-size", "4", "--stage", "2", "--accumulation-steps", "4",
            "--accumulate-unsharded")["plans"][0]
one = plans("--model", "gpt2", "--world-size", "4", "--stage", "1", "--accumulation-steps", "4")["plans"][0]
grad = lambda p: next(t for t in p["traffic_per_step"] if t["purpose"] == "gradients")
check(grad(acc)["bytes"] == 4 * grad(uns)["bytes"], "--accumulate-unsharded: one reduce_scatter per step")
check(uns["memory_per_rank"]["gradients"] == one["memory_per_rank"]["gradients"], "--accumulate-unsharded: full gradients")

sys.exit(finish())
