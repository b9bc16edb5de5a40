#!/usr/bin/env python3
"""Example 01's recipe trained by PyTorch's own DDP and powerSGD_hook, as a reference for the
accuracy cost of PowerSGD that ringzero's hook (include/ringzero/ddp/powersgd_hook.hpp) shows.

The Fashion-MNIST MLP of examples/01_ddp_fashion_mnist (784-256-128-10, ReLU, nn.Linear's
initialisation), pixels scaled by the training set's mean and standard deviation, 2 ranks
(processes, the gloo backend) of 256 examples per step each (a global batch of 512, shuffled
every epoch), SGD with momentum 0.9 and learning rate 0.1, cross-entropy, 10 epochs; then the
test accuracy. --compress powersgd:R registers torch.distributed's powerSGD_hook with
PowerSGDState(matrix_approximation_rank=R, start_powerSGD_iter=--powersgd-start) and PyTorch's
other defaults (error feedback, warm start, min_compression_rate 2), as example 01 does.

    /usr/bin/python3 bench/powersgd_pytorch_reference.py --seeds 1 2 3               # none and powersgd:2
    /usr/bin/python3 bench/powersgd_pytorch_reference.py --compress powersgd:2 --seeds 1

Needs Debian's python3-torch (PyTorch 1.13 with gloo) and the system Python that sees it. Prints one line per run and the medians.
Not a test: nothing in the test command runs it (docs/performance.md quotes its results).
"""
import argparse
import gzip
import os
import statistics
import struct
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powersgd
from torch.nn.parallel import DistributedDataParallel as DDP


def read_idx(path):
    """An IDX file (gzip) as a uint8 tensor of its shape."""
    with gzip.open(path, "rb") as f:
        data = f.read()
    dims = data[3]
    shape = struct.unpack(">" + "I" * dims, data[4:4 + 4 * dims])
    return torch.frombuffer(bytearray(data[4 + 4 * dims:]), dtype=torch.uint8).reshape(shape)


def load(data_dir):
    x = read_idx(os.path.join(data_dir, "train-images-idx3-ubyte.gz")).reshape(-1, 784).double() / 255.0
    y = read_idx(os.path.join(data_dir, "train-labels-idx1-ubyte.gz")).long()
    tx = read_idx(os.path.join(data_dir, "t10k-images-idx3-ubyte.gz")).reshape(-1, 784).double() / 255.0
    ty = read_idx(os.path.join(data_dir, "t10k-labels-idx1-ubyte.gz")).long()
    mean, std = x.mean().item(), x.std(unbiased=False).item()  # the training set's, as example 01
    return ((x - mean) / std).float(), y, ((tx - mean) / std).float(), ty


def run(rank, world, args, seed, compress, port, results):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    x, y, tx, ty = load(args.data_dir)
    torch.manual_seed(seed)  # the same initial model on every rank (DDP broadcasts rank 0's anyway)
    model = nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 128), nn.ReLU(), nn.Linear(128, 10))
    ddp = DDP(model)
    if compress.startswith("powersgd:"):
        state = powersgd.PowerSGDState(process_group=None, matrix_approximation_rank=int(compress.split(":")[1]),
                                       start_powerSGD_iter=args.powersgd_start, random_seed=seed)
        ddp.register_comm_hook(state, powersgd.powerSGD_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=args.lr, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    global_batch = args.batch_size * world
    steps = x.shape[0] // global_batch
    g = torch.Generator().manual_seed(seed)
    for _ in range(args.epochs):
        order = torch.randperm(x.shape[0], generator=g)
        for s in range(steps):
            idx = order[s * global_batch + rank * args.batch_size:s * global_batch + (rank + 1) * args.batch_size]
            opt.zero_grad()
            loss_fn(ddp(x[idx]), y[idx]).backward()
            opt.step()
    with torch.no_grad():
        accuracy = (model(tx).argmax(1) == ty).float().mean().item()
    if rank == 0:
        results.put(accuracy)
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--compress", nargs="*", default=["none", "powersgd:2"])
    p.add_argument("--seeds", nargs="*", type=int, default=[1, 2, 3])
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--powersgd-start", type=int, default=100)
    p.add_argument("--data-dir", default="/usr/share/datasets/fashion-mnist")
    args = p.parse_args()
    ctx = mp.get_context("spawn")
    port = 29600
    medians = {}
    for compress in args.compress:
        accuracies = []
        for seed in args.seeds:
            results = ctx.SimpleQueue()
            port += 1
            mp.start_processes(run, args=(2, args, seed, compress, port, results), nprocs=2, join=True,
                               start_method="spawn")
            accuracies.append(results.get())
            print(f"{compress} seed {seed}: test accuracy {accuracies[-1]:.4f}", flush=True)
        medians[compress] = statistics.median(accuracies)
    for compress, m in medians.items():
        print(f"{compress}: median test accuracy {m:.4f}")
    if "none" in medians:
        for compress, m in medians.items():
            if compress != "none":
                print(f"{compress} - none: {100 * (m - medians['none']):+.2f} points")
    return 0


if __name__ == "__main__":
    sys.exit(main())
