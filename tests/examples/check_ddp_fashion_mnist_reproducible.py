#!/usr/bin/env python3
"""examples/01_ddp_fashion_mnist with --reproducible --micro-batch: the final parameters are the
same bits on 1, 2 and 4 ranks (issue 21). One short epoch on 2000 Fashion-MNIST images, global
batch 512 in micro-batches of 32 (3 optimizer steps of 16 micro-batches), run twice:
- in compare mode (--compare-ranks 1,2,4), which must print "parameters bitwise identical across
  1, 2, 4 ranks: yes" and record the same CRC-32 for every run in its JSON;
- as separate processes with --ranks 1, 2 and 4 (the default global batch is the same for every
  rank count), which must record that same CRC-32 too.
The identical training loss of the runs is checked as well (it is summed in float64 over
micro-batches computed on different ranks, so it is only compared to 1e-12).

usage: check_ddp_fashion_mnist_reproducible.py TRAINER
"""
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from command_check import check, run, finish  # noqa: E402

DATA = "/usr/share/datasets/fashion-mnist"
COMMON = ["--reproducible", "--micro-batch", "32", "--epochs", "1", "--train-subset", "2000", "--test-subset", "500",
          "--no-progress", "--data", DATA]


def main() -> int:
    trainer = sys.argv[1]
    if not os.path.exists(os.path.join(DATA, "train-images-idx3-ubyte.gz")):
        print(f"skipped: no Fashion-MNIST in {DATA}")
        return 77  # meson's skip status
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "metrics.json")
        p = run(trainer, "--compare-ranks", "1,2,4", *COMMON, "--json", path)
        crcs = []
        if check(p.returncode == 0, f"compare mode: exit status {p.returncode}"):
            check("parameters bitwise identical across 1, 2, 4 ranks: yes (crc32 " in p.stdout,
                  "compare mode does not report identical parameters")
            with open(path) as f:
                out = json.load(f)
            crcs = [r["parameter_crc32"] for r in out["runs"]]
            check([r["ranks"] for r in out["runs"]] == [1, 2, 4], f"runs of {[r['ranks'] for r in out['runs']]} ranks")
            check(len(set(crcs)) == 1, f"compare mode: CRC-32 per run {crcs}")
            check(out["parameters_bitwise_identical"] is True, "compare mode: parameters_bitwise_identical is not true")
            losses = [r["epochs"][0]["train_loss"] for r in out["runs"]]
            check(max(losses) - min(losses) <= 1e-12, f"compare mode: training losses {losses}")
            accuracies = [r["final_test_accuracy"] for r in out["runs"]]
            check(len(set(accuracies)) == 1, f"compare mode: test accuracies {accuracies} (same parameters, same test set)")
        for n in (1, 2, 4):
            p = run(trainer, "--ranks", str(n), *COMMON, "--json", path)
            if not check(p.returncode == 0, f"--ranks {n}: exit status {p.returncode}"):
                continue
            with open(path) as f:
                out = json.load(f)
            run_out = out["runs"][0]
            check(run_out["global_batch"] == 512 and run_out["per_rank_batch"] == 32 and run_out["accumulate"] == 16 // n,
                  f"--ranks {n}: global batch {run_out['global_batch']}, {run_out['per_rank_batch']} per rank x "
                  f"{run_out['accumulate']} micro-steps")
            if crcs:
                check(run_out["parameter_crc32"] == crcs[0],
                      f"--ranks {n}: CRC-32 {run_out['parameter_crc32']}, compare mode {crcs[0]}")
    return finish()


if __name__ == "__main__":
    sys.exit(main())
