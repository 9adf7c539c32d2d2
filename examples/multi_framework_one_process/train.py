"""Compute features with JAX, then train a PyTorch model on them, in one process.

The bug: each framework keeps its own memory pool on the GPU, and neither gives memory back
to the other. JAX pre-allocation is already off here (`XLA_PYTHON_CLIENT_PREALLOCATE=false`,
as the docs suggest), but JAX's pool still grows to the largest working set it saw (60% of
the GPU for the feature pass) and keeps it. PyTorch then needs half the GPU for training and
finds only what JAX left. Run the two stages in separate processes, make JAX return memory it
no longer uses (`XLA_PYTHON_CLIENT_ALLOCATOR=platform`, slower), or cap each framework with
a memory fraction.

GPU only: it needs PyTorch and JAX sharing one GPU.
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import jax
import jax.numpy as jnp
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

WIDTH = 4096


def jax_features(total_bytes: int) -> np.ndarray:
    """A feature pass whose working set is 60% of the GPU; only a small result is kept."""
    rows = int(0.6 * total_bytes) // (3 * WIDTH * 4)
    inputs = jax.random.normal(jax.random.key(0), (rows, WIDTH))
    hidden = jnp.tanh(inputs @ jnp.eye(WIDTH))
    return np.asarray(hidden[:1024].mean(axis=0))


def train_torch(features: np.ndarray, total_bytes: int) -> None:
    device = torch.device("cuda")
    model = nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.ReLU(), nn.Linear(WIDTH, WIDTH)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    batch_size = int(0.5 * total_bytes) // (6 * WIDTH * 4)  # a step needs half the GPU
    base = torch.from_numpy(features).to(device)
    for step in range(1, 11):
        inputs = base + torch.randn(batch_size, WIDTH, device=device)
        loss = F.mse_loss(model(inputs), inputs)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        print(f"step {step}: loss {loss.item():.4f}", flush=True)


def main() -> None:
    if not torch.cuda.is_available() or jax.devices()[0].platform == "cpu":
        sys.exit("this example needs a GPU visible to both JAX and PyTorch")
    total_bytes = torch.cuda.get_device_properties(0).total_memory
    features = jax_features(total_bytes)
    peak_bytes = jax.devices()[0].memory_stats()["peak_bytes_in_use"]
    print(f"features ready; JAX's pool grew to {peak_bytes / 2**30:.1f} GiB and stays", flush=True)
    train_torch(features, total_bytes)


if __name__ == "__main__":
    main()
