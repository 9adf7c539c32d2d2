"""A small PyTorch conv net on 32x32 images, SGD with momentum, under a 64 MiB budget.

Usage: torch_cnn.py BATCH. Trains 12 steps; the feature maps saved for the backward pass grow
with the batch.
"""

from __future__ import annotations

import sys

import torch
from _cap import cap_address_space, steady_malloc
from torch import nn

BATCH = int(sys.argv[1])
BUDGET_MIB, STEPS = 64, 12


def main() -> None:
    steady_malloc()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(16, 16, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(32, 10),
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    model(torch.randn(1, 3, 32, 32)).sum().backward()  # warm the kernels before the cap
    optimizer.zero_grad()
    cap_address_space(BUDGET_MIB)
    for step in range(1, STEPS + 1):
        images = torch.randn(BATCH, 3, 32, 32)
        labels = torch.randint(0, 10, (BATCH,))
        loss = nn.functional.cross_entropy(model(images), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        print(f"step {step}", flush=True)
    print("done", flush=True)


if __name__ == "__main__":
    main()
