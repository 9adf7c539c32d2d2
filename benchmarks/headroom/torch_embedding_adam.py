"""A model over token sequences whose big embedding table (100k rows of 128) dominates memory,
trained with Adam, under a 360 MiB budget.

Usage: torch_embedding_adam.py BATCH. Trains 12 steps on sequences of 64 tokens. The
table's dense gradient and Adam's two state tensors (each as large as the table) appear at
the first backward pass and the first optimizer step: the fixed part dwarfs the per-sample
part, and the first step's peak is well under the second's.
"""

from __future__ import annotations

import sys

import torch
from _cap import cap_address_space, steady_malloc
from torch import nn

BATCH = int(sys.argv[1])
BUDGET_MIB, STEPS = 360, 12
ROWS, WIDTH, SEQ, HIDDEN = 100_000, 128, 64, 1024


def main() -> None:
    steady_malloc()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    table = nn.Embedding(ROWS, WIDTH)
    tower = nn.Sequential(
        nn.Linear(WIDTH, HIDDEN),
        nn.ReLU(),
        nn.Linear(HIDDEN, WIDTH),
        nn.ReLU(),
        nn.Linear(WIDTH, 1),
    )
    optimizer = torch.optim.Adam([*table.parameters(), *tower.parameters()], lr=1e-3)
    cap_address_space(BUDGET_MIB)
    for step in range(1, STEPS + 1):
        ids = torch.randint(0, ROWS, (BATCH, SEQ))
        target = torch.rand(BATCH, 1)
        loss = nn.functional.mse_loss(tower(table(ids)).mean(1), target)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        print(f"step {step}", flush=True)
    print("done", flush=True)


if __name__ == "__main__":
    main()
