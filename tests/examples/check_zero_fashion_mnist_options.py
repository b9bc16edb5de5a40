#!/usr/bin/env python3
"""The command line of examples/02_zero_fashion_mnist, as example 01's: numeric options that are not
numbers the trainer can use (nan, inf, values beyond their range or beyond float32 where the
optimizer applies them as float32, signs, spaces and base prefixes where a count is expected, empty
items in --hidden) are refused at once with the option and the value named, never wrapped, ignored
or replaced by a default; optimizer values that clash are refused before the data is loaded; the
values accepted mean what they say; running out of memory names the model.

usage: check_zero_fashion_mnist_options.py TRAINER

Exit status: CLI11's validation error (105) for a value an option's check refuses, 1 for optimizer
options that are checked together. The refusals need no dataset; the accepted values are trained
for one short epoch on 1000 Fashion-MNIST images when the dataset is installed (else that part is
skipped).
"""
import json
import os
import resource
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from command_check import check, check_refused_options, run, finish  # noqa: E402

DATA = "/usr/share/datasets/fashion-mnist"
VALIDATION_ERROR = 105  # CLI::ExitCodes::ValidationError, as every refused option of the trainer
SHORT = ["--epochs", "1", "--train-subset", "1000", "--test-subset", "500", "--batch-size", "50", "--no-progress"]


def main() -> int:
    trainer = sys.argv[1]
    missing = os.path.join(tempfile.gettempdir(), "ringzero-no-such-fashion-mnist-dir")
    # Options refused by their checks, before anything is loaded (--data points nowhere: a value
    # that got through would report the missing data instead).
    refused = [
        ("--lr", "nan"), ("--lr", "inf"), ("--lr", "-inf"), ("--lr", "1e39"), ("--lr", "1e-46"), ("--lr", "1e-40"),
        ("--lr", "0"), ("--lr", "-1"), ("--lr", " 1"), ("--lr", "1 "), ("--lr", "x"),
        ("--weight-decay", "nan"), ("--weight-decay", "inf"), ("--weight-decay", "1e39"), ("--weight-decay", "1e-40"),
        ("--weight-decay", "-1"),
        ("--momentum", "nan"), ("--momentum", "1.5"), ("--momentum", "-0.1"), ("--momentum", "1e-45"),
        ("--clip-norm", "nan"), ("--clip-norm", "inf"), ("--clip-norm", "-1"),
        ("--min-accuracy", "nan"), ("--min-accuracy", "inf"), ("--min-accuracy", "1.5"), ("--min-accuracy", "-0.1"),
        ("--seed", "-1"), ("--seed", "18446744073709551616"), ("--seed", "010"),
        ("--train-subset", "-1"), ("--train-subset", "99999999999999999999999"), ("--test-subset", "-5"),
        ("--hidden", "5,,5"), ("--hidden", ",5"), ("--hidden", "5,"), ("--hidden", "5, 5"), ("--hidden", "0"),
        ("--hidden", "-5"), ("--hidden", "65537"), ("--hidden", "100000000"),
        ("--stage", "4"), ("--stage", " 1"), ("--stage", "1 "), ("--stage", "nan"), ("--ranks", "+2"), ("--ranks", "0x2"),
        ("--epochs", "1e3"), ("--batch-size", " 8"), ("--accumulate", "-1"), ("--max-inflight-reductions", "nan"),
        ("--alignment", "-16"), ("--alignment", "0x10"),
    ]
    check_refused_options(trainer, refused, missing, VALIDATION_ERROR)

    # Each value accepted on its own, but the optimizer they make cannot run: refused before the
    # data with exit status 1, the options, their values and the reason named.
    for args, words in [
        (["--optimizer", "adamw", "--lr", "1", "--weight-decay", "2"],
         ["--optimizer adamw --lr 1 --weight-decay 2: learning rate 1 x weight decay 2 = 2 is above 1"]),
        (["--optimizer", "adam", "--lr", "3e38"],
         ["--optimizer adam --lr 3e+38 --weight-decay 0: learning rate 3e+38 / (1 - beta1 0.9)", "first step size"]),
    ]:
        p = run(trainer, *args, "--data", missing, "--epochs", "1", "--no-progress")
        check(p.returncode == 1, f"{args}: exit status {p.returncode}, expected 1")
        check(all(w in p.stderr for w in words), f"{args}: the error does not say {words}")
        check(missing not in p.stderr, f"{args}: accepted (the trainer went on to load the data)")

    # Accepted: the limits themselves (the trainer goes on to the missing data).
    # (3.4028235e38 and 1.17549435e-38 are the decimals <float.h> prints for FLT_MAX and FLT_MIN.)
    for args in [["--lr", "3.4e38"], ["--lr", "1.2e-38"], ["--lr", "3.4028235e38"], ["--lr", "1.17549435e-38"],
                 ["--weight-decay", "0"], ["--momentum", "1"], ["--momentum", "0"],
                 ["--min-accuracy", "1"], ["--seed", "18446744073709551615"], ["--hidden", "1,65536"],
                 ["--hidden", "5", "--hidden", "6,7"], ["--optimizer", "adamw", "--lr", "0.5", "--weight-decay", "2"]]:
        p = run(trainer, *args, "--data", missing, "--epochs", "1", "--no-progress")
        check(p.returncode == 1 and missing in p.stderr, f"{args}: refused ({p.stderr.strip()})")
        # The program names itself once: "zero_fashion_mnist: cannot open ...", not followed by "ringzero: ".
        check(p.stderr.startswith("zero_fashion_mnist: cannot open") and "ringzero: " not in p.stderr,
              f"{args}: the error does not name the program once ({p.stderr.strip()})")

    if not os.path.exists(os.path.join(DATA, "train-images-idx3-ubyte.gz")):
        print(f"skipped the training runs: no Fashion-MNIST in {DATA}")
        return finish()

    # The configuration a run reports: widths from every --hidden value in order; an explicit 0
    # weight decay is 0, not AdamW's default; the defaults where nothing is given.
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "metrics.json")
        for args, expected in [
            (["--hidden", "7,5", "--hidden", "3"], {"widths": [784, 7, 5, 3, 10], "learning_rate": 0.1, "weight_decay": 0}),
            (["--optimizer", "adamw", "--weight-decay", "0", "--lr", "0.002"],
             {"widths": [784, 256, 128, 10], "learning_rate": 0.002, "weight_decay": 0}),
            (["--optimizer", "adamw"], {"learning_rate": 0.001, "weight_decay": 0.01}),
            (["--seed", "18446744073709551615", "--stage", "0"], {"seed": 18446744073709551615}),
        ]:
            p = run(trainer, *args, *SHORT, "--data", DATA, "--json", path)
            if not check(p.returncode == 0, f"{args}: exit status {p.returncode}"):
                continue
            with open(path) as f:
                config = json.load(f)["config"]
            for key, value in expected.items():
                check(config[key] == value, f"{args}: config {key} {config[key]}, expected {value}")

    # --accumulate-unsharded at stage 2: the plan the run reports reduce_scatters once per step
    # (the calls of one micro-step) and holds the full gradients (stage 1's), no gradient bucket.
    with tempfile.TemporaryDirectory() as d:
        plans = []
        for args in (["--stage", "2", "--accumulate", "4"], ["--stage", "2", "--accumulate", "4", "--accumulate-unsharded"],
                     ["--stage", "1", "--accumulate", "4"]):
            path = os.path.join(d, "plan.json")
            p = run(trainer, *args, *SHORT, "--data", DATA, "--json", path)
            if check(p.returncode == 0, f"{args}: exit status {p.returncode}: {p.stderr.strip()[-300:]}"):
                with open(path) as f:
                    plans.append(json.load(f)["plan"])
        if len(plans) == 3:
            calls = [next(t["calls"] for t in pl["traffic"] if t["purpose"] == "gradients") for pl in plans]
            check(calls[0] == 4 * calls[1] and calls[1] == calls[2], f"--accumulate-unsharded: reduce_scatter calls {calls}")
            check(plans[1]["memory"]["gradients"] == plans[2]["memory"]["gradients"] and plans[1]["gradient_buckets"] == 0,
                  "--accumulate-unsharded: stage 1's gradient memory, no bucket")

    # --min-accuracy 1 cannot be reached on 1000 images: exit status 3.
    p = run(trainer, "--min-accuracy", "1", *SHORT, "--data", DATA)
    check(p.returncode == 3 and "below --min-accuracy 1.0000" in p.stderr, f"--min-accuracy 1: exit status {p.returncode}")

    # Out of memory (address space limited to 1 GiB): the activations of 784-65536-65536-10 need
    # more; the error names the model, not a bare std::bad_alloc.
    def limit_memory():
        resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))

    args = [trainer, "--ranks", "1", "--stage", "3", "--hidden", "65536,65536", *SHORT, "--data", DATA]
    p = subprocess.run(args, capture_output=True, text=True, timeout=120, preexec_fn=limit_memory)
    print(f"$ (address space 1 GiB) {' '.join(args)}\n  exit status {p.returncode}; stderr: {p.stderr.strip()[:400]}")
    if "Sanitizer" in p.stderr:
        print("skipped the out-of-memory run: a sanitizer needs more address space than the limit")
    else:
        check(p.returncode == 1, f"out of memory: exit status {p.returncode}, expected 1")
        check(p.stderr.startswith("zero_fashion_mnist: out of memory for the MLP 784-65536-65536-10 (4347133962 parameters, "
                                  "16.19 GiB per float32 copy, and the activations of 1000 examples per layer)"),
              f"out of memory: the error does not name the model ({p.stderr.strip()[:300]})")
    return finish()


if __name__ == "__main__":
    sys.exit(main())
