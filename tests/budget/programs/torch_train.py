"""PyTorch on the CPU: an MLP (16 -> 8192 -> 16) trained with Adam for 30 steps, the batch
size from argv (default 4096). Its memory is mostly the activations of the wide hidden
layer, kept for the backward pass (128 MiB a tensor at 4096 rows).

LEAK=1: also keeps a slice of each step's hidden activations (4 MiB at 4096 rows) in a
list, as a feature log kept "for later" does: the memory grows every step.
WIDER=1: the hidden layer 10% wider, so every step's activations are 10% larger."""

import os
import sys

import torch
from torch import nn

torch.manual_seed(0)
torch.set_num_threads(1)
STEPS = 30
BATCH = int(sys.argv[1]) if len(sys.argv) > 1 else 4096
HIDDEN = 8192 * 11 // 10 if os.environ.get("WIDER") == "1" else 8192
LEAK = os.environ.get("LEAK") == "1"


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(16, HIDDEN)
        self.down = nn.Linear(HIDDEN, 16)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        hidden = torch.relu(self.up(x))
        return self.down(hidden), hidden


model = MLP()
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
kept = []
for _step in range(STEPS):
    batch = torch.randn(BATCH, 16)
    out, hidden = model(batch)
    loss = (out - batch).square().mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    if LEAK:
        kept.append(hidden[:, :256].detach().clone())
print("trained", STEPS, "steps")
