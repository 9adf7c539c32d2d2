"""Start one training process per rank, as torchrun does, without giving each its own GPU.

The bug: each rank moves its model with `.to("cuda")`, which means the *current* device, and
nobody called `torch.cuda.set_device(local_rank)`, so every rank lands on GPU 0. Each rank
sizes its work for a GPU of its own (40% of it), so the third rank on GPU 0 runs out while
the other GPUs (if any) stay idle. The fix is one line at the top of each rank:
`torch.cuda.set_device(local_rank)`, or `device = torch.device("cuda", local_rank)`.

GPU only. The ranks are started with torch.multiprocessing, with the environment torchrun
would give them (RANK, LOCAL_RANK, WORLD_SIZE).
"""

from __future__ import annotations

import os
import sys

import torch
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import nn

WORLD_SIZE = 4
STEPS = 20


def run_rank(local_rank: int, world_size: int) -> None:
    os.environ.update(RANK=str(local_rank), LOCAL_RANK=str(local_rank), WORLD_SIZE=str(world_size))
    device = torch.device("cuda")  # BUG: the current device, GPU 0 in every rank
    total_bytes = torch.cuda.get_device_properties(device).total_memory
    width = 8192
    model = nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, width)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    # Each rank's step is sized to use 40% of "its" GPU (about six values of `width` per
    # sample, forward and backward).
    batch_size = int(0.4 * total_bytes) // (6 * width * 4)
    for step in range(1, STEPS + 1):
        inputs = torch.randn(batch_size, width, device=device)
        loss = F.mse_loss(model(inputs), inputs)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % 5 == 0:
            print(f"rank {local_rank} step {step}: loss {loss.item():.4f}", flush=True)


def main() -> None:
    if not torch.cuda.is_available():
        sys.exit("this example needs a CUDA GPU")
    mp.spawn(run_rank, args=(WORLD_SIZE,), nprocs=WORLD_SIZE)


if __name__ == "__main__":
    main()
