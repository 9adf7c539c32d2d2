"""Data-parallel training of an MLP classifier on two ranks (torchrun, gloo, CPU): a run
with no memory problem.

Both ranks train with a modest batch, nothing is kept from step to step but numbers, rank
0 logs a running loss. Memory rises while the first step allocates the optimizer state and
the buckets, then stays flat on both ranks; the run finishes.
"""

from __future__ import annotations

import resource

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel

BUDGET_BYTES = 512 << 20  # per rank: as on a machine with 1 GiB to spare for two ranks
FEATURES, HIDDEN, CLASSES, BATCH, STEPS = 256, 512, 10, 64, 200


def cap_address_space(budget_bytes: int) -> None:
    """Allow this process `budget_bytes` more address space, so it fails in seconds."""
    with open("/proc/self/statm") as statm:
        mapped = int(statm.read().split()[0]) * resource.getpagesize()
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    soft = mapped + budget_bytes
    resource.setrlimit(resource.RLIMIT_AS, (soft if hard < 0 else min(soft, hard), hard))


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    torch.ones(1 << 20).sum()  # start the thread pool before the cap: its stacks count
    net = nn.Sequential(
        nn.Linear(FEATURES, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, HIDDEN), nn.ReLU(),
        nn.Linear(HIDDEN, CLASSES),
    )  # fmt: skip
    model = DistributedDataParallel(net)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    cap_address_space(BUDGET_BYTES)
    generator = torch.Generator().manual_seed(1 + rank)
    running = 0.0
    for step in range(1, STEPS + 1):
        labels = torch.randint(CLASSES, (BATCH,), generator=generator)
        features = torch.randn(BATCH, FEATURES, generator=generator)
        features[:, :CLASSES] += 2 * F.one_hot(labels, CLASSES)
        loss = F.cross_entropy(model(features), labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        running += loss.item()
        if rank == 0 and step % 50 == 0:
            print(f"step {step}: mean loss {running / 50:.3f}", flush=True)
            running = 0.0
    dist.destroy_process_group()
    if rank == 0:
        print("training finished")


if __name__ == "__main__":
    main()
