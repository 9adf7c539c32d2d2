"""A PyTorch training loop that keeps a tensor per step (a leak), under a memory cap.

Usage: torch_leak.py [LEAK_MIB] [BUDGET_MIB] [SLEEP_S]. Prints "step N" as it goes; dies
with a memory error when the kept tensors fill the budget.
"""

from __future__ import annotations

import sys
import time

import torch
from host_cap import cap_address_space, steady_malloc
from torch import nn

LEAK_MIB = float(sys.argv[1]) if len(sys.argv) > 1 else 3.0
BUDGET_MIB = int(sys.argv[2]) if len(sys.argv) > 2 else 400
SLEEP_S = float(sys.argv[3]) if len(sys.argv) > 3 else 0.04


def main() -> None:
    steady_malloc()
    torch.set_num_threads(1)
    torch.ones(1 << 20).sum()
    cap_address_space(BUDGET_MIB << 20)
    model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 10))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    kept: list[torch.Tensor] = []
    for step in range(1, 100_000):
        batch = torch.randn(64, 256)
        loss = model(batch).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        kept.append(torch.full((int(LEAK_MIB * (1 << 20)) // 4,), float(step)))  # the leak
        print(f"step {step}", flush=True)
        time.sleep(SLEEP_S)


if __name__ == "__main__":
    main()
