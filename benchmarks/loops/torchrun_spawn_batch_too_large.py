"""Data-parallel training of a small conv net on two ranks started with
`torch.multiprocessing.spawn` (gloo, CPU), with a per-rank batch far too large.

The per-rank batch of 512 images of 64x64 was kept when the job moved to smaller
machines. On each rank, one step's feature maps (saved for the backward pass) and their
gradients need several times the memory the rank has, and both ranks run out in their
first step. A per-rank batch of 128 trains.
"""

from __future__ import annotations

import os
import resource
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel

BUDGET_BYTES = 512 << 20  # per rank: as on a machine with 1 GiB to spare for two ranks
WORLD, SIDE, CLASSES, BATCH, STEPS = 2, 64, 10, 512, 20


def cap_address_space(budget_bytes: int) -> None:
    """Allow this process `budget_bytes` more address space, so it fails in seconds."""
    with open("/proc/self/statm") as statm:
        mapped = int(statm.read().split()[0]) * resource.getpagesize()
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    soft = mapped + budget_bytes
    resource.setrlimit(resource.RLIMIT_AS, (soft if hard < 0 else min(soft, hard), hard))


def make_net() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(),
        nn.Conv2d(32, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(4),
        nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, CLASSES),
    )  # fmt: skip


def train(rank: int, port: int) -> None:
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    torch.manual_seed(0)
    torch.set_num_threads(1)
    torch.ones(1 << 20).sum()  # start the thread pool before the cap: its stacks count
    # oneDNN reports a failed allocation as "could not create a primitive"; the plain kernels
    # raise the allocator's own error, as on a GPU.
    torch.backends.mkldnn.enabled = False
    model = DistributedDataParallel(make_net())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    cap_address_space(BUDGET_BYTES)
    generator = torch.Generator().manual_seed(1 + rank)
    for step in range(1, STEPS + 1):
        images = torch.rand(BATCH, 3, SIDE, SIDE, generator=generator)
        labels = torch.randint(CLASSES, (BATCH,), generator=generator)
        loss = F.cross_entropy(model(images), labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if rank == 0:
            print(f"step {step}: loss {loss.item():.3f}", flush=True)
    dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


if __name__ == "__main__":
    mp.spawn(train, args=(free_port(),), nprocs=WORLD)
