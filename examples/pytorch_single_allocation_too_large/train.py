"""Fit a regression whose loss broadcasts predictions of shape (N, 1) against targets (N,).

The bug is a shape one: `F.mse_loss(prediction, target)` with a (N, 1) prediction and an (N,)
target broadcasts to an (N, N) matrix. With N = 262,144 that is one 256 GiB request, more
than any GPU (or most hosts) has. PyTorch warns about it ("Using a target size ... that is
different to the input size"); the warning scrolls by, the allocation does not.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

BATCH_SIZE = 1 << 18
FEATURES = 16
STEPS = 10


def main() -> None:
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = nn.Sequential(nn.Linear(FEATURES, 64), nn.ReLU(), nn.Linear(64, 1)).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    true_weights = torch.randn(FEATURES, device=device)

    for step in range(1, STEPS + 1):
        features = torch.randn(BATCH_SIZE, FEATURES, device=device)
        target = features @ true_weights  # shape (N,)
        prediction = model(features)  # shape (N, 1)
        loss = F.mse_loss(prediction, target)  # BUG: (N, 1) - (N,) broadcasts to (N, N)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        print(f"step {step}: loss {loss.item():.4f}", flush=True)


if __name__ == "__main__":
    main()
