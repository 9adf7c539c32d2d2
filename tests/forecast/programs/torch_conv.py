"""A small conv net on 32×32 images under a memory cap; optionally keeps a feature map per
step (a leak).

Usage: torch_conv.py BATCH [BUDGET_MIB] [STEPS] [KEEP_EVERY]. With KEEP_EVERY > 0, every
that many steps the first conv layer's output is kept, graph and all (the classic
"append the outputs for logging" leak).
"""

from __future__ import annotations

import sys

import torch
from host_cap import cap_address_space, steady_malloc
from torch import nn

BATCH = int(sys.argv[1])
BUDGET_MIB = int(sys.argv[2]) if len(sys.argv) > 2 else 300
STEPS = int(sys.argv[3]) if len(sys.argv) > 3 else 6
KEEP_EVERY = int(sys.argv[4]) if len(sys.argv) > 4 else 0


def main() -> None:
    steady_malloc()
    torch.set_num_threads(1)
    torch.ones(1 << 20).sum()
    cap_address_space(BUDGET_MIB << 20)
    features = nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 16, 3, padding=1), nn.ReLU()
    )
    model = nn.Sequential(features, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    kept: list[torch.Tensor] = []
    for step in range(1, STEPS + 1):
        images = torch.randn(BATCH, 3, 32, 32)
        labels = torch.randint(10, (BATCH,))
        maps = features(images)
        logits = model[3](model[2](model[1](maps)))
        loss = nn.functional.cross_entropy(logits, labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if KEEP_EVERY and step % KEEP_EVERY == 0:
            kept.append(maps)  # the leak: a feature map per step, kept for "logging"
        print(f"step {step}", flush=True)
    print("done", flush=True)


if __name__ == "__main__":
    main()
