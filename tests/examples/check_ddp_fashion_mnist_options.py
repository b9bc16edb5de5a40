#!/usr/bin/env python3
"""The command line of examples/01_ddp_fashion_mnist: numeric options that are not numbers the
trainer can use (nan, inf, values beyond their range or their type, signs and spaces where a count
is expected) are refused at once with the option and the value named, never wrapped, cast or
ignored; large but representable bucket limits are accepted and mean what they say.

usage: check_ddp_fashion_mnist_options.py TRAINER

Exit status: CLI11's validation error (105) for a value an option's check refuses, 1 for options
that are checked together (the global batch of --batch-size, the ranks and --accumulate;
--compare-ranks; --micro-batch against the global batch and the ranks, and against --batch-size and
--accumulate; --reproducible with --compress or --device cuda; --link-gbps without --backend mpi). The refusals need no dataset; the accepted values are trained for one short
epoch on 1000 Fashion-MNIST images when the dataset is installed (else that part is skipped).
"""
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from command_check import check, check_refused_options, run, finish  # noqa: E402

DATA = "/usr/share/datasets/fashion-mnist"
VALIDATION_ERROR = 105  # CLI::ExitCodes::ValidationError, as every refused option of the trainer


def main() -> int:
    trainer = sys.argv[1]
    missing = os.path.join(tempfile.gettempdir(), "ringzero-no-such-fashion-mnist-dir")
    # Options refused by their checks, before anything is loaded (--data points nowhere: a value
    # that got through would report the missing data instead).
    refused = [
        ("--bucket-mb", "nan"), ("--bucket-mb", "inf"), ("--bucket-mb", "-inf"), ("--bucket-mb", "1e30"),
        ("--bucket-mb", "1e400"), ("--bucket-mb", "1099511627777"), ("--bucket-mb", "-1"), ("--bucket-mb", "x"),
        ("--first-bucket-mb", "nan"), ("--first-bucket-mb", "inf"), ("--first-bucket-mb", "1e30"),
        ("--first-bucket-mb", "-0.5"),
        ("--min-accuracy", "nan"), ("--min-accuracy", "inf"), ("--min-accuracy", "1.5"), ("--min-accuracy", "-0.1"),
        ("--seed", "-1"), ("--seed", "18446744073709551616"), ("--seed", "010"),
        ("--train-subset", "-1"), ("--train-subset", "99999999999999999999999"), ("--test-subset", "-5"),
        ("--hidden", "0"), ("--hidden", "-5"), ("--hidden", "65537"), ("--hidden", "5,,5"), ("--hidden", "64,"),
        ("--hidden", "64,0"),
        ("--epochs", "1e3"), ("--epochs", "nan"), ("--ranks", "+2"), ("--ranks", "0x2"), ("--batch-size", " 8"),
        ("--accumulate", "-1"), ("--global-batch", "1e30"),
        ("--micro-batch", "0"), ("--micro-batch", "-4"), ("--micro-batch", "1048577"), ("--micro-batch", "nan"),
        ("--micro-batch", "+8"),
        ("--compress", "powersgd:0"), ("--compress", "powersgd:"), ("--compress", "powersgd:abc"),
        ("--compress", "powersgd:1025"), ("--compress", "powersgd:-1"), ("--compress", "zstd"),
        ("--powersgd-start", "-1"), ("--check-replicas", "-1"), ("--check-replicas", "x"),
        ("--link-gbps", "0"), ("--link-gbps", "nan"), ("--link-gbps", "inf"), ("--link-gbps", "-1"),
        ("--link-gbps", "0.0001"),
    ]
    check_refused_options(trainer, refused, missing, VALIDATION_ERROR)

    # Checked together, before the data: exit status 1 and the values named.
    for args, words in [
        (["--compare-ranks", "1,+2"], ["--compare-ranks", "+2"]),
        (["--compare-ranks", "1, 2"], ["--compare-ranks", " 2"]),
        (["--compare-ranks", "1,300"], ["--compare-ranks", "300"]),
        # 2^20 x 2 x 2^16 overflowed int to 0: a division by zero (SIGFPE) in compare mode
        (["--compare-ranks", "1,2", "--batch-size", "1048576", "--accumulate", "65536"], ["--batch-size", "1048576", "65536"]),
        (["--ranks", "256", "--batch-size", "1048576", "--accumulate", "65536"], ["--batch-size", "1048576", "65536"]),
        # --micro-batch must divide the global batch, and the micro-batches must divide among the ranks
        (["--micro-batch", "30"], ["--micro-batch 30", "global batch 512"]),
        (["--micro-batch", "30", "--global-batch", "100"], ["--micro-batch 30", "global batch 100"]),
        (["--ranks", "3", "--micro-batch", "32"], ["--micro-batch 32", "16 micro-batches", "3 rank(s)"]),
        (["--compare-ranks", "1,2,4", "--micro-batch", "64", "--global-batch", "128"],
         ["--micro-batch 64", "2 micro-batches", "4 rank(s)"]),
        # it sets the per-rank batch and the micro-steps itself
        (["--micro-batch", "32", "--batch-size", "16"], ["--micro-batch", "--batch-size"]),
        (["--micro-batch", "32", "--accumulate", "2"], ["--micro-batch", "--accumulate"]),
        # reproducible mode: no 16-bit compression, no CUDA device
        (["--reproducible", "--compress", "bf16"], ["--reproducible", "--compress bf16"]),
        (["--reproducible", "--compress", "fp16"], ["--reproducible", "--compress fp16"]),
        (["--reproducible", "--device", "cuda"], ["--reproducible", "--device cpu"]),
        (["--micro-batch", "32", "--device", "cuda"], ["--micro-batch", "--device cpu"]),
        (["--reproducible", "--compress", "powersgd:2"], ["--reproducible", "--compress powersgd:2"]),
        (["--compress", "powersgd:2", "--device", "cuda"], ["--compress powersgd:2", "--device cpu"]),
        # a paced link needs MPI processes
        (["--link-gbps", "1"], ["--link-gbps", "--backend mpi"]),
    ]:
        p = run(trainer, *args, "--data", missing, "--epochs", "1", "--no-progress")
        check(p.returncode == 1, f"{args}: exit status {p.returncode}, expected 1")
        check(all(w in p.stderr for w in words), f"{args}: the error does not name {words}")
        check(missing not in p.stderr, f"{args}: accepted (the trainer went on to load the data)")

    # --powersgd-start without --compress powersgd:R is refused, not ignored.
    p = run(trainer, "--powersgd-start", "5", "--compress", "fp16", "--data", missing, "--epochs", "1", "--no-progress")
    check(p.returncode == VALIDATION_ERROR and "--powersgd-start" in p.stderr and "powersgd:R" in p.stderr,
          f"--powersgd-start without powersgd: exit status {p.returncode}, {p.stderr.strip()!r}")

    # Accepted: 0 (documented: one bucket per tensor) and large limits up to 2^40 MiB.
    for option, value in [("--bucket-mb", "0"), ("--bucket-mb", "1e6"), ("--bucket-mb", "1099511627776"),
                          ("--first-bucket-mb", "0"), ("--min-accuracy", "1"), ("--seed", "18446744073709551615")]:
        p = run(trainer, option, value, "--data", missing, "--epochs", "1", "--no-progress")
        check(p.returncode == 1 and missing in p.stderr, f"{option} {value}: refused ({p.stderr.strip()})")
        # The program names itself once: "ddp_fashion_mnist: cannot open ...", not followed by "ringzero: ".
        check(p.stderr.startswith("ddp_fashion_mnist: cannot open") and "ringzero: " not in p.stderr,
              f"{option} {value}: the error does not name the program once ({p.stderr.strip()})")

    if not os.path.exists(os.path.join(DATA, "train-images-idx3-ubyte.gz")):
        print(f"skipped the training runs: no Fashion-MNIST in {DATA}")
    else:
        # The byte limits the reducer gets, and the buckets they make of the 6 tensors (918.5 KiB).
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "metrics.json")
            for args, limits, buckets in [
                (["--bucket-mb", "0"], [0], 6),
                (["--bucket-mb", "1e6"], [1000000 << 20], 1),
                (["--bucket-mb", "1099511627776"], [1 << 60], 1),
                (["--bucket-mb", "1e6", "--first-bucket-mb", "0"], [0, 1000000 << 20], 2),
            ]:
                p = run(trainer, *args, "--ranks", "2", "--epochs", "1", "--train-subset", "1000", "--test-subset", "500",
                        "--no-progress", "--data", DATA, "--json", path)
                if not check(p.returncode == 0, f"{args}: exit status {p.returncode}"):
                    continue
                with open(path) as f:
                    out = json.load(f)
                got = out["config"]["bucket_byte_limits"]
                check(got == limits, f"{args}: bucket byte limits {got}, expected {limits}")
                got = out["runs"][0]["buckets"]
                check(got == buckets, f"{args}: {got} bucket(s), expected {buckets}")
            # --hidden takes widths separated by spaces or by commas (as example 02).
            for args in (["--hidden", "16", "8"], ["--hidden", "16,8"]):
                p = run(trainer, *args, "--epochs", "1", "--train-subset", "1000", "--test-subset", "500",
                        "--no-progress", "--data", DATA, "--json", path)
                if check(p.returncode == 0, f"{args}: exit status {p.returncode}"):
                    with open(path) as f:
                        got = json.load(f)["config"]["hidden"]
                    check(got == [16, 8], f"{args}: hidden {got}, expected [16, 8]")

    return finish()


if __name__ == "__main__":
    sys.exit(main())
