"""A PyTorch model whose activations grow with the batch, under a memory cap.

Usage: torch_batch.py BATCH [BUDGET_MIB] [STEPS]. Activations per sample are about
`SEQ × WIDTH × 4 bytes` per saved tensor, so memory is fixed + slope × batch.
"""

from __future__ import annotations

import sys

import torch
from host_cap import cap_address_space, steady_malloc
from torch import nn

BATCH = int(sys.argv[1])
BUDGET_MIB = int(sys.argv[2]) if len(sys.argv) > 2 else 320
STEPS = int(sys.argv[3]) if len(sys.argv) > 3 else 6
SEQ, WIDTH = 128, 64


def main() -> None:
    steady_malloc()
    torch.set_num_threads(1)
    torch.ones(1 << 20).sum()
    cap_address_space(BUDGET_MIB << 20)
    model = nn.Sequential(
        nn.Linear(WIDTH, WIDTH),
        nn.GELU(),
        nn.LayerNorm(WIDTH),
        nn.Linear(WIDTH, WIDTH),
        nn.GELU(),
        nn.Linear(WIDTH, 1),
    )
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    for step in range(1, STEPS + 1):
        batch = torch.randn(BATCH, SEQ, WIDTH)
        loss = model(batch).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        print(f"step {step}", flush=True)
    print("done", flush=True)


if __name__ == "__main__":
    main()
