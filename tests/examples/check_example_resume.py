#!/usr/bin/env python3
"""Checkpoints in examples 01 and 02 (--checkpoint, --resume, --init-from, --epochs 0):
- resuming is exact: 2 epochs straight and 1 + --resume 1 print the same train loss and test
  accuracy for epoch 2 and end with the same state (the final checkpoints' tensors have the same
  checksums: parameters, optimizer states and step count, bit for bit), for example 02 at stages
  0-3 with SGD and AdamW and for example 01's DDP with SGD and AdamW;
- example 02 resumes at another --ranks and --stage: the restored parameters are bitwise those
  that were saved, and training goes on; --device sim (the device path on host streams) resumes
  exactly too (stages 1 and 3; at stage 3 also with --precision bfloat16 and --offload optimizer
  or --offload parameters),
  and its checkpoints resume on --device cpu and the reverse;
- --epochs 0 evaluates: with --init-from a consolidated checkpoint (ringzero-ckpt consolidate)
  the accuracy is the trained model's, in both examples (one file initialises either);
- refusals: a --resume directory without a checkpoint, a checkpoint of another model (other
  --hidden widths) or another optimizer, a missing --init-from file, --resume with --init-from;
  a --checkpoint root whose lock another job holds, a file as --checkpoint, a FIFO or a NaN as
  --init-from (all before any training step); a root without `latest` resumes from its complete
  checkpoint, named, and Adam resuming AdamW's moments says so;
- --keep-checkpoints 2 over 3 epochs leaves the newest two (`latest` the last) in both examples,
  and is refused without --checkpoint.

usage: check_example_resume.py ZERO_TRAINER DDP_TRAINER RINGZERO_CKPT
Runs on 2000 training images (skipped, status 77, without Debian's dataset-fashion-mnist).
"""
import fcntl
import json
import os
import re
import shutil
import struct
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from command_check import check, run, finish  # noqa: E402

DATA = "/usr/share/datasets/fashion-mnist"
SMALL = ["--train-subset", "2000", "--test-subset", "500", "--batch-size", "50", "--hidden", "32", "--no-progress"]
EPOCH_LINE = re.compile(r"epoch\s+(\d+)/\d+ .*train loss (\S+)\s+test acc (\S+)")


def epochs_of(stdout):
    """epoch -> (train loss, test accuracy) as printed."""
    return {int(m.group(1)): (m.group(2), m.group(3)) for m in EPOCH_LINE.finditer(stdout)}


def final_state(root):
    """The newest checkpoint's tensors (names, roles, shapes and every chunk checksum) and progress."""
    latest = open(os.path.join(root, "latest")).read().strip()
    index = json.load(open(os.path.join(root, latest, "index.json")))
    return latest, [(t["name"], t["role"], t.get("state"), t["shape"], [f["xxh3"] for f in t["fragments"]]) for t in index["tensors"]], index["progress"]


def straight_vs_resumed(trainer, tmp, label, args):
    """2 epochs straight against 1 + resume 1, with `args`; both save checkpoints."""
    a, b = os.path.join(tmp, label + "-a"), os.path.join(tmp, label + "-b")
    p1 = run(trainer, *SMALL, *args, "--epochs", "2", "--checkpoint", a)
    p2 = run(trainer, *SMALL, *args, "--epochs", "1", "--checkpoint", b)
    p3 = run(trainer, *SMALL, *args, "--epochs", "2", "--resume", b, "--checkpoint", b)
    if not check(p1.returncode == 0 and p2.returncode == 0 and p3.returncode == 0, f"{label}: a run failed"):
        return
    e1, e2, e3 = epochs_of(p1.stdout), epochs_of(p2.stdout), epochs_of(p3.stdout)
    check(sorted(e1) == [1, 2] and sorted(e2) == [1] and sorted(e3) == [2], f"{label}: epochs printed {sorted(e1)}, {sorted(e2)}, {sorted(e3)}")
    check(e1.get(1) == e2.get(1), f"{label}: epoch 1 differs: {e1.get(1)} vs {e2.get(1)}")
    check(e1.get(2) == e3.get(2), f"{label}: the resumed epoch 2 printed {e3.get(2)}, the straight run {e1.get(2)}")
    check("resumed from" in p3.stdout and "after epoch 1" in p3.stdout, f"{label}: the resumed run does not say so")
    sa, sb = final_state(a), final_state(b)
    check(sa == sb, f"{label}: the final checkpoints differ ({sa[0]}, {sb[0]})")


def main() -> int:
    zero, ddp, tool = sys.argv[1], sys.argv[2], sys.argv[3]
    if not os.path.exists(os.path.join(DATA, "train-images-idx3-ubyte.gz")):
        print(f"SKIP: no Fashion-MNIST in {DATA} (Debian package dataset-fashion-mnist)")
        return 77
    tmp = tempfile.mkdtemp(prefix="ringzero-resume-")
    try:
        for stage in range(4):
            for optimizer in ["sgd", "adamw"]:
                straight_vs_resumed(zero, tmp, f"02-stage{stage}-{optimizer}", ["--stage", str(stage), "--optimizer", optimizer])
        for optimizer in ["sgd", "adamw"]:
            straight_vs_resumed(ddp, tmp, f"01-{optimizer}", ["--optimizer", optimizer])
        # The simulated device (the device path on host streams) checkpoints and resumes exactly too.
        for stage in [1, 3]:
            straight_vs_resumed(zero, tmp, f"02-sim-stage{stage}-adamw", ["--device", "sim", "--stage", str(stage), "--optimizer", "adamw"])
        # bfloat16 parameters and gradients with float32 master weights, offloaded: the checkpoint
        # holds both and resumes exactly.
        for offload in ["optimizer", "parameters"]:  # parameters: the shards in host memory too
            straight_vs_resumed(zero, tmp, f"02-sim-stage3-bfloat16-offload-{offload}",
                                ["--device", "sim", "--stage", "3", "--optimizer", "adamw", "--precision", "bfloat16",
                                 "--offload", offload])

        # --keep-checkpoints 2 over 3 epochs: the root keeps the newest two, `latest` the last.
        for trainer, name in ((zero, "02"), (ddp, "01")):
            root = os.path.join(tmp, name + "-keep")
            p = run(trainer, *SMALL, "--epochs", "3", "--checkpoint", root, "--keep-checkpoints", "2")
            steps = sorted(d for d in os.listdir(root) if d.startswith("step-")) if os.path.isdir(root) else []
            latest = open(os.path.join(root, "latest")).read().strip() if steps else ""
            check(p.returncode == 0 and len(steps) == 2 and latest == steps[-1],
                  f"{name}: --keep-checkpoints 2 after 3 epochs left {steps}, latest {latest!r}")
            p = run(trainer, *SMALL, "--epochs", "1", "--keep-checkpoints", "2")
            check(p.returncode != 0 and "--checkpoint" in p.stderr, f"{name}: --keep-checkpoints without --checkpoint")

        # Example 02 at another --ranks and --stage: the saved parameters come back bit for bit.
        root = os.path.join(tmp, "02-reshard")
        saved, restored = os.path.join(tmp, "saved.f32"), os.path.join(tmp, "restored.f32")
        p = run(zero, *SMALL, "--optimizer", "adamw", "--ranks", "2", "--stage", "3", "--epochs", "1", "--checkpoint", root,
                "--save-parameters", saved)
        check(p.returncode == 0, "02: the 2-rank stage-3 run failed")
        for ranks, stage in [("3", "1"), ("1", "0"), ("4", "2")]:
            p = run(zero, *SMALL, "--optimizer", "adamw", "--ranks", ranks, "--stage", stage, "--epochs", "1", "--resume", root,
                    "--save-parameters", restored)
            check(p.returncode == 0 and "no epoch to train (1 of 1 done)" in p.stdout, f"02 at {ranks} ranks, stage {stage}: resume to evaluate")
            check(os.path.exists(restored) and open(saved, "rb").read() == open(restored, "rb").read(),
                  f"02 at {ranks} ranks, stage {stage}: the restored parameters differ from the saved ones")
        p = run(zero, *SMALL, "--optimizer", "adamw", "--ranks", "3", "--stage", "1", "--epochs", "2", "--resume", root)
        check(p.returncode == 0 and sorted(epochs_of(p.stdout)) == [2], "02: training on at 3 ranks, stage 1")
        # A checkpoint of the simulated device resumes on the host runtime at another world size and
        # stage, and the reverse: the parameters come back bit for bit.
        root_sim, saved_sim = os.path.join(tmp, "02-reshard-sim"), os.path.join(tmp, "saved-sim.f32")
        p = run(zero, *SMALL, "--optimizer", "adamw", "--device", "sim", "--ranks", "2", "--stage", "3", "--epochs", "1",
                "--checkpoint", root_sim, "--save-parameters", saved_sim)
        check(p.returncode == 0, "02 --device sim: the 2-rank stage-3 run failed")
        for device, ranks, stage, source, expected in [("cpu", "3", "1", root_sim, saved_sim), ("sim", "1", "2", root, saved)]:
            if os.path.exists(restored):
                os.remove(restored)
            p = run(zero, *SMALL, "--optimizer", "adamw", "--device", device, "--ranks", ranks, "--stage", stage, "--epochs",
                    "1", "--resume", source, "--save-parameters", restored)
            what = f"02 --device {device} at {ranks} ranks, stage {stage}, from {os.path.basename(source)}"
            check(p.returncode == 0 and "no epoch to train (1 of 1 done)" in p.stdout, f"{what}: resume to evaluate")
            check(os.path.exists(restored) and open(expected, "rb").read() == open(restored, "rb").read(),
                  f"{what}: the restored parameters differ from the saved ones")

        # --epochs 0 with --init-from a consolidated checkpoint: the trained model's accuracy, in both examples.
        trained = os.path.join(tmp, "02-stage0-adamw-a")
        model = os.path.join(tmp, "model.safetensors")
        p = run(tool, "consolidate", trained, "-o", model)
        check(p.returncode == 0, "consolidate of example 02's checkpoint")
        final_acc = epochs_of(run(zero, *SMALL, "--optimizer", "adamw", "--stage", "0", "--epochs", "2").stdout).get(2, ("", ""))[1]
        for trainer in [zero, ddp]:
            p = run(trainer, *SMALL, "--epochs", "0", "--init-from", model)
            m = re.search(r"no epoch to train \(0 of 0 done\): test loss \S+\s+test acc (\S+)", p.stdout)
            check(p.returncode == 0 and m is not None and m.group(1) == final_acc,
                  f"{os.path.basename(trainer)} --epochs 0 --init-from: accuracy {m.group(1) if m else None}, expected {final_acc}")
        p = run(zero, *SMALL, "--epochs", "0")
        check(p.returncode == 0 and "no epoch to train (0 of 0 done)" in p.stdout, "02 --epochs 0 evaluates the initial model")

        # Refusals, each naming what was wrong.
        empty = os.path.join(tmp, "empty")
        os.makedirs(empty)
        for trainer in [zero, ddp]:
            name = os.path.basename(trainer)
            p = run(trainer, *SMALL, "--epochs", "2", "--resume", empty)
            check(p.returncode == 1 and "holds no complete checkpoint" in p.stderr and empty in p.stderr, f"{name}: --resume of an empty directory")
            p = run(trainer, *SMALL[:-3], "--hidden", "16", "--no-progress", "--epochs", "2", "--resume", trained)
            check(p.returncode == 1 and "'fc1.weight'" in p.stderr and "shape" in p.stderr, f"{name}: --resume of another model")
            p = run(trainer, *SMALL, "--epochs", "1", "--init-from", os.path.join(tmp, "missing.safetensors"))
            check(p.returncode == 1 and "missing.safetensors" in p.stderr, f"{name}: a missing --init-from file")
            p = run(trainer, *SMALL, "--epochs", "1", "--init-from", model, "--resume", trained)
            check(p.returncode != 0 and "--init-from" in p.stderr and "--resume" in p.stderr, f"{name}: --resume with --init-from")
        p = run(zero, *SMALL, "--optimizer", "sgd", "--epochs", "3", "--resume", trained)
        check(p.returncode == 1 and "another optimizer" in p.stderr, "02: --resume with another optimizer")
        p = run(ddp, *SMALL, "--compare-ranks", "1,2", "--epochs", "1", "--checkpoint", os.path.join(tmp, "x"))
        check(p.returncode == 1 and "--compare-ranks" in p.stderr, "01: --checkpoint with --compare-ranks")

        # Issue 33: a root another job saves into (its lock held here), a file as --checkpoint, a
        # FIFO or a NaN as --init-from: refused before any training, naming what was wrong.
        locked = os.path.join(tmp, "locked")
        os.makedirs(locked)
        holder = os.open(os.path.join(locked, ".lock"), os.O_RDWR | os.O_CREAT)
        fcntl.flock(holder, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.write(holder, b"host elsewhere pid 4242 since 2026-12-03T12:00:00Z\n")
        not_a_dir = os.path.join(tmp, "a-file")
        open(not_a_dir, "w").write("x")
        fifo = os.path.join(tmp, "fifo.safetensors")
        os.mkfifo(fifo)
        nan_model = os.path.join(tmp, "nan.safetensors")
        data = bytearray(open(model, "rb").read())
        header = json.loads(data[8:8 + struct.unpack("<Q", data[:8])[0]])
        at = 8 + struct.unpack("<Q", data[:8])[0] + header["fc2.weight"]["data_offsets"][0] + 4 * 5
        data[at:at + 4] = struct.pack("<f", float("nan"))
        open(nan_model, "wb").write(data)
        for trainer in [zero, ddp]:
            name = os.path.basename(trainer)
            p = run(trainer, *SMALL, "--epochs", "1", "--checkpoint", locked)
            check(p.returncode == 1 and "in use by another saver (host elsewhere pid 4242" in p.stderr
                  and not epochs_of(p.stdout), f"{name}: a --checkpoint root another job holds")
            p = run(trainer, *SMALL, "--epochs", "1", "--checkpoint", not_a_dir)
            check(p.returncode == 1 and not_a_dir in p.stderr and not epochs_of(p.stdout), f"{name}: a file as --checkpoint")
            p = run(trainer, *SMALL, "--epochs", "0", "--init-from", fifo, timeout=20)
            check(p.returncode == 1 and "it is a FIFO" in p.stderr, f"{name}: a FIFO as --init-from")
            p = run(trainer, *SMALL, "--epochs", "1", "--json", fifo, timeout=20)
            check(p.returncode != 0 and "FIFO" in p.stderr and not epochs_of(p.stdout), f"{name}: a FIFO as --json")
            p = run(trainer, *SMALL, "--epochs", "0", "--init-from", nan_model)
            check(p.returncode == 1 and "'fc2.weight'" in p.stderr and "non-finite" in p.stderr and "element 5" in p.stderr,
                  f"{name}: a NaN in --init-from")
            p = run(trainer, *SMALL, "--epochs", "0", "--init-from", nan_model, "--allow-nonfinite")
            check(p.returncode == 0, f"{name}: --allow-nonfinite")
        # A float32 value finite in the file but beyond bfloat16's range rounds to infinity in a
        # --precision bfloat16 model: refused as the file's own infinities are; float32 takes it.
        big_model = os.path.join(tmp, "big.safetensors")
        data = bytearray(open(model, "rb").read())
        data[at:at + 4] = struct.pack("<f", 3.4028234663852886e38)
        open(big_model, "wb").write(data)
        p = run(zero, *SMALL, "--epochs", "0", "--init-from", big_model, "--precision", "bfloat16")
        check(p.returncode == 1 and "'fc2.weight'" in p.stderr and "element 5" in p.stderr and "beyond the range" in p.stderr,
              "02 --precision bfloat16: a float32 value beyond bfloat16's range in --init-from")
        p = run(zero, *SMALL, "--epochs", "0", "--init-from", big_model)
        check(p.returncode == 0, "02 float32: a large finite value in --init-from")
        os.close(holder)

        # A root without `latest` (a job killed before its first one): the complete checkpoint,
        # named; AdamW's moments resumed by Adam, with a note.
        no_latest = os.path.join(tmp, "no-latest")
        shutil.copytree(trained, no_latest)
        os.remove(os.path.join(no_latest, "latest"))
        p = run(zero, *SMALL, "--optimizer", "adam", "--epochs", "1", "--resume", no_latest)
        check(p.returncode == 0 and "took the newest complete checkpoint" in p.stdout
              and "kind adamw -> adam" in p.stdout, "02: --resume of a root without latest, with another Adam")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return finish()


if __name__ == "__main__":
    sys.exit(main())
