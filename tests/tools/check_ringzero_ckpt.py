#!/usr/bin/env python3
"""ringzero-ckpt on the C18 checkpoint (an embedding [11, 4] tied to the output layer, a frozen
[6, 3] layer, AdamW after 2 steps, saved at stage 2 by 3 ranks; tests/tools/checkpoint_fixture.cpp):
- inspect (text and --json): shapes, dtypes, roles, ranks, sizes, the tie and the frozen layer;
- verify: every checksum matches; a flipped byte exits 1 naming the fragment, the file and the
  rank; a truncated file exits 1 naming the file and the rank;
- consolidate read back by Python's safetensors package (Hugging Face's reader): every parameter
  by name equal bit for bit to what the model held, both tied names identical, the frozen layer
  included; --dtype bfloat16 rounds each value to nearest even; --max-shard-size splits into
  model-0000i-of-0000N.safetensors files with Hugging Face's index;
- reshard offline to 2 ranks at stage 3 and to 5 ranks at stage 1: the new checkpoint verifies
  and loads on those ranks with every tensor (parameters and Adam moments) bitwise equal to
  loading the original;
- bad option values exit 1 naming them; a reshard too large for the disk is refused up front;
- special files: a FIFO as `latest` is refused at once by every subcommand; consolidate refuses
  a FIFO, a directory, a symbolic link (unless --force) and an empty path as its output, leaving
  nothing behind; without `latest` the newest complete checkpoint is taken and named; an index
  edited after the save fails verify and consolidate.

usage: check_ringzero_ckpt.py RINGZERO_CKPT CHECKPOINT_FIXTURE
Exit status: 0, 1 on a failed check, 77 (skipped) when the safetensors environment cannot be made.
"""
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, ".."))
from command_check import check, run, finish  # noqa: E402
from python_safetensors import safetensors_python  # noqa: E402

READER = """
import json, sys
from safetensors import deserialize
out = {}
for name, t in deserialize(open(sys.argv[1], "rb").read()):
    out[name] = {"dtype": t["dtype"], "shape": list(t["shape"]), "hex": bytes(t["data"]).hex()}
print(json.dumps(out))
"""


def read_with_safetensors(python, path):
    """name -> {dtype, shape, hex} as Python's safetensors package reads `path`."""
    p = subprocess.run([python, "-c", READER, path], capture_output=True, text=True, timeout=120)
    if not check(p.returncode == 0, f"safetensors cannot read {path}: {p.stderr.strip()[-600:]}"):
        return {}
    return json.loads(p.stdout)


def metadata_of(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        return json.loads(f.read(n)).get("__metadata__", {})


def bf16_bits(f32_bits):
    """float32 bits -> bfloat16 bits, round to nearest even (no NaN in these values)."""
    return (f32_bits + 0x7FFF + ((f32_bits >> 16) & 1)) >> 16


def main() -> int:
    tool, fixture = sys.argv[1], sys.argv[2]
    build_dir = os.path.dirname(os.path.dirname(os.path.abspath(tool)))
    python = safetensors_python(build_dir)
    if python is None:
        print("SKIP: Python's safetensors package is not available")
        return 77
    tmp = tempfile.mkdtemp(prefix="ringzero-ckpt-check-")
    try:
        root, expected = os.path.join(tmp, "ckpt"), os.path.join(tmp, "expected.safetensors")
        p = run(fixture, "save", root, "3", "2", expected)
        if not check(p.returncode == 0, "the fixture could not save the C18 checkpoint"):
            return finish()
        want = read_with_safetensors(python, expected)
        names = ["embed", "l1.w", "frozen.w", "l1.b", "out"]
        check(sorted(want) == sorted(names), f"the fixture wrote {sorted(want)}")

        # inspect
        p = run(tool, "inspect", root)
        check(p.returncode == 0, "inspect failed")
        for text in ["saved by 3 rank(s) at stage 2", "rank-00000-of-00003.safetensors", "rank-00002-of-00003.safetensors",
                     "[11, 4]", "tied to 'embed'", "[frozen]", "state 1 (exp_avg_sq)", "2 optimizer step(s), epoch 1",
                     "RNG seeds [7]"]:
            check(text in p.stdout, f"inspect does not print {text!r}")
        p = run(tool, "inspect", root, "--json")
        check(p.returncode == 0, "inspect --json failed")
        j = json.loads(p.stdout) if p.returncode == 0 else {}
        check(j.get("world_size") == 3 and j.get("stage") == 2 and j.get("kind") == "zero", "inspect --json: world size, stage, kind")
        check([f["rank"] for f in j.get("files", [])] == [0, 1, 2], "inspect --json: one file per rank")
        tensors = {(t["name"], t["role"], t.get("state", 0)): t for t in j.get("tensors", [])}
        embed = tensors.get(("embed", "parameter", 0), {})
        check(embed.get("shape") == [11, 4] and embed.get("dtype") == "float32" and embed.get("bytes") == 176,
              f"inspect --json: embed is {embed}")
        check(sum(f["bytes"] for f in embed.get("fragments", [])) == 176, "inspect --json: embed's fragments do not add up to 176 bytes")
        check(len({f["rank"] for f in embed.get("fragments", [])}) == 3, "inspect --json: embed is not spread over 3 ranks at stage 2")
        check(tensors.get(("out", "parameter", 0), {}).get("tied_to") == "embed", "inspect --json: out is not tied to embed")
        check(tensors.get(("frozen.w", "parameter", 0), {}).get("trainable") is False, "inspect --json: frozen.w is not frozen")
        check(("frozen.w", "optimizer_state", 0) not in tensors, "inspect --json: a frozen layer has optimizer state")
        check(("l1.w", "optimizer_state", 1) in tensors, "inspect --json: l1.w has no exp_avg_sq")

        # verify
        p = run(tool, "verify", root)
        check(p.returncode == 0 and "every checksum matches" in p.stdout, "verify of an intact checkpoint")
        ckdir = os.path.join(root, "c18")
        shard = os.path.join(ckdir, "rank-00001-of-00003.safetensors")
        data = bytearray(open(shard, "rb").read())
        original = bytes(data)
        data[-5] ^= 0x01
        open(shard, "wb").write(data)
        p = run(tool, "verify", root)
        check(p.returncode == 1, f"verify of a flipped byte exited {p.returncode}, expected 1")
        check("DAMAGED fragment '" in p.stdout and "rank-00001-of-00003.safetensors" in p.stdout and "of rank 1:" in p.stdout
              and "checksum mismatch" in p.stdout, f"verify does not name the fragment, file and rank: {p.stdout}")
        check(p.stdout.count("DAMAGED") == 1, "verify reports intact fragments as damaged")
        p = run(tool, "consolidate", root, "-o", os.path.join(tmp, "bad.safetensors"))
        check(p.returncode == 1 and "rank-00001-of-00003.safetensors" in p.stderr, "consolidate of a damaged checkpoint")
        check(not os.path.exists(os.path.join(tmp, "bad.safetensors")), "consolidate of a damaged checkpoint left a file")
        open(shard, "wb").write(original)
        last = os.path.join(ckdir, "rank-00002-of-00003.safetensors")
        saved = open(last, "rb").read()
        open(last, "wb").write(saved[:-4])
        p = run(tool, "verify", root)
        check(p.returncode == 1 and "DAMAGED file" in p.stdout and "rank-00002-of-00003.safetensors" in p.stdout and "of rank 2" in p.stdout,
              "verify of a truncated file does not name it and its rank")
        open(last, "wb").write(saved)
        p = run(tool, "verify", os.path.join(tmp, "nothing-here"))
        check(p.returncode == 1 and "no complete checkpoint" in p.stderr, "verify of a missing directory")

        # consolidate, read back by Python's safetensors
        model = os.path.join(tmp, "model.safetensors")
        p = run(tool, "consolidate", root, "-o", model)
        check(p.returncode == 0, "consolidate failed")
        got = read_with_safetensors(python, model)
        check(sorted(got) == sorted(names), f"consolidated names {sorted(got)}")
        for name in names:
            if name in got and name in want:
                check(got[name]["dtype"] == "F32" and got[name]["hex"] == want[name]["hex"], f"{name}: not the model's values")
        check(got.get("embed", {}).get("shape") == [11, 4] and got.get("out", {}).get("shape") == [11, 4], "tied shapes")
        check(got.get("out", {}).get("hex") == got.get("embed", {}).get("hex"), "the tied names differ")
        check(got.get("frozen.w", {}).get("shape") == [6, 3], "the frozen layer's shape")
        check(metadata_of(model) == {"format": "pt"}, "the consolidated file's metadata")

        p = run(tool, "consolidate", root, "-o", os.path.join(tmp, "bf16.safetensors"), "--dtype", "bfloat16")
        check(p.returncode == 0, "consolidate --dtype bfloat16 failed")
        got16 = read_with_safetensors(python, os.path.join(tmp, "bf16.safetensors"))
        for name in names:
            if name not in got16 or name not in want:
                continue
            words = struct.unpack(f"<{len(want[name]['hex']) // 8}I", bytes.fromhex(want[name]["hex"]))
            expect = b"".join(struct.pack("<H", bf16_bits(w)) for w in words)
            check(got16[name]["dtype"] == "BF16" and got16[name]["hex"] == expect.hex(), f"{name}: not rounded to bfloat16")

        split = os.path.join(tmp, "split")
        os.makedirs(split)
        p = run(tool, "consolidate", root, "-o", os.path.join(split, "model.safetensors"), "--max-shard-size", "100B")
        check(p.returncode == 0, "consolidate --max-shard-size failed")
        files = sorted(os.listdir(split))
        check(files == ["model-0000%d-of-00004.safetensors" % k for k in range(1, 5)] + ["model.safetensors.index.json"],
              f"split files {files}")
        index = json.load(open(os.path.join(split, "model.safetensors.index.json")))
        check(index.get("metadata", {}).get("total_size") == (44 + 24 + 18 + 6 + 44) * 4, "index total_size")
        check(sorted(index.get("weight_map", {})) == sorted(names), "index weight_map names")
        for name, file in index.get("weight_map", {}).items():
            part = read_with_safetensors(python, os.path.join(split, file))
            check(part.get(name, {}).get("hex") == want.get(name, {}).get("hex"), f"{name} in {file}")

        # reshard offline, then load on the new world size: every tensor as loading the original
        for world, stage in [(2, 3), (5, 1)]:
            out = os.path.join(tmp, f"r{world}")
            p = run(tool, "reshard", root, "--world-size", str(world), "--stage", str(stage), "-o", out)
            check(p.returncode == 0, f"reshard --world-size {world} failed")
            p = run(tool, "verify", out)
            check(p.returncode == 0, f"the checkpoint resharded to {world} ranks does not verify")
            p = run(tool, "inspect", out, "--json")
            jj = json.loads(p.stdout) if p.returncode == 0 else {}
            check(jj.get("world_size") == world and jj.get("stage") == stage and len(jj.get("files", [])) == world,
                  f"the resharded index: world {jj.get('world_size')}, stage {jj.get('stage')}")
            a, b = os.path.join(tmp, f"a{world}.safetensors"), os.path.join(tmp, f"b{world}.safetensors")
            pa = run(fixture, "load", root, str(world), str(stage), a)
            pb = run(fixture, "load", out, str(world), str(stage), b)
            if check(pa.returncode == 0 and pb.returncode == 0, f"loading on {world} ranks failed"):
                sa, sb = read_with_safetensors(python, a), read_with_safetensors(python, b)
                check(len(sa) == 5 + 2 * 3 and sa == sb, f"{world} ranks: the resharded state differs from the original's")
                check(sb.get("embed#parameter", {}).get("hex") == want.get("embed", {}).get("hex"), "the resharded embedding")

        # bad option values
        p = run(tool, "consolidate", root, "-o", os.path.join(tmp, "x.safetensors"), "--max-shard-size", "5XB")
        check(p.returncode == 1 and "'5XB'" in p.stderr and "--max-shard-size" in p.stderr, "a bad --max-shard-size")
        p = run(tool, "consolidate", root, "-o", os.path.join(tmp, "x.safetensors"), "--dtype", "int8")
        check(p.returncode == 1 and "int8" in p.stderr, "--dtype int8")
        p = run(tool, "reshard", root, "--world-size", "0", "-o", os.path.join(tmp, "x"))
        check(p.returncode == 1 and "--world-size" in p.stderr, "--world-size 0")
        p = run(tool, "reshard", root, "--world-size", "2", "-o", root)
        check(p.returncode == 1 and "own root" in p.stderr, "reshard into the source's root")
        p = run(tool, "reshard", root, "--world-size", "16777216", "-o", os.path.join(tmp, "huge"))
        check(p.returncode == 1 and "16777216 rank file(s)" in p.stderr and "at most 1048576" in p.stderr,
              "reshard to 16777216 ranks is not refused up front")
        check(not os.path.exists(os.path.join(tmp, "huge", ".tmp.c18")), "a refused reshard left files")

        # Special files (issue 33): a FIFO as `latest` is refused at once by every subcommand;
        # consolidate never replaces anything but a regular file and leaves nothing behind.
        fifo_root = os.path.join(tmp, "fifo-root")
        shutil.copytree(root, fifo_root)
        os.remove(os.path.join(fifo_root, "latest"))
        os.mkfifo(os.path.join(fifo_root, "latest"))
        for args in (["inspect"], ["verify"], ["consolidate", "-o", os.path.join(tmp, "f.safetensors")],
                     ["reshard", "--world-size", "2", "-o", os.path.join(tmp, "f")]):
            p = run(tool, args[0], fifo_root, *args[1:], timeout=10)
            check(p.returncode == 1 and "it is a FIFO" in p.stderr, f"{args[0]} with a FIFO as latest")
        out = os.path.join(tmp, "outputs")
        os.makedirs(os.path.join(out, "dir"))
        os.mkfifo(os.path.join(out, "fifo"))
        os.symlink(os.path.join(out, "target.safetensors"), os.path.join(out, "link"))
        before = sorted(os.listdir(out))
        for name, why in (("fifo", "it is a FIFO"), ("dir", "it is a directory"), ("link", "is a symbolic link")):
            p = run(tool, "consolidate", root, "-o", os.path.join(out, name), timeout=10)
            check(p.returncode == 1 and why in p.stderr, f"consolidate -o {name} is not refused naming it")
        p = run(tool, "consolidate", root, "-o", "")
        check(p.returncode == 1 and "empty" in p.stderr, "consolidate -o '' is not refused")
        check(sorted(os.listdir(out)) == before, f"a refused consolidate left {sorted(os.listdir(out))}")
        check(not os.path.exists(".tmp"), "consolidate -o '' left ./.tmp")
        p = run(tool, "consolidate", root, "-o", os.path.join(out, "link"), "--force")
        check(p.returncode == 0 and os.path.islink(os.path.join(out, "link"))
              and os.path.isfile(os.path.join(out, "target.safetensors")), "consolidate --force through a symlink")

        # Without `latest`: the newest complete checkpoint, named on stderr.
        os.remove(os.path.join(fifo_root, "latest"))
        p = run(tool, "inspect", fifo_root)
        check(p.returncode == 0 and "took the newest complete checkpoint 'c18'" in p.stderr,
              "inspect of a root without latest does not take (and name) the complete checkpoint")

        # The index is bound: an edit after the save (a tensor removed) fails verify and consolidate.
        index_path = os.path.join(fifo_root, "c18", "index.json")
        j = json.load(open(index_path))
        j["tensors"].pop()
        json.dump(j, open(index_path, "w"))
        p = run(tool, "verify", os.path.join(fifo_root, "c18"))
        check(p.returncode == 1 and "own checksum" in p.stderr, "verify of an edited index")
        p = run(tool, "consolidate", os.path.join(fifo_root, "c18"), "-o", os.path.join(tmp, "edited.safetensors"))
        check(p.returncode == 1 and not os.path.exists(os.path.join(tmp, "edited.safetensors")),
              "consolidate of an edited index")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return finish()


if __name__ == "__main__":
    sys.exit(main())
