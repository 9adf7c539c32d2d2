"""Fit a coordinate MLP (NeRF-style) on a batch of points far too large for the device.

The bug: the batch size was chosen for throughput on a bigger machine. The weights are tiny;
what does not fit is the activations autograd keeps for the backward pass, about 1.5 KiB per
point here, times a batch of millions of points.
"""

from __future__ import annotations

import resource

import torch
import torch.nn.functional as F
from torch import nn

HOST_BUDGET_BYTES = 512 << 20  # on CPU: run as if on a machine with 512 MiB to spare
HIDDEN, DEPTH = 32, 6
# Autograd keeps about this much per point for the backward pass (ReLU outputs, Linear inputs).
ACTIVATION_BYTES_PER_POINT = 2 * DEPTH * HIDDEN * 4
STEPS = 100


class CoordinateMLP(nn.Module):
    """Maps a 3-D point to a colour and a density."""

    def __init__(self) -> None:
        super().__init__()
        layers: list[nn.Module] = [nn.Linear(3, HIDDEN), nn.ReLU()]
        for _ in range(DEPTH - 1):
            layers += [nn.Linear(HIDDEN, HIDDEN), nn.ReLU()]
        self.body = nn.Sequential(*layers)
        self.head = nn.Linear(HIDDEN, 4)

    def forward(self, points: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(points))


def limit_host_memory(budget_bytes: int) -> int:
    """Let this process map only `budget_bytes` more, as on a small machine: it then fails
    in seconds instead of pushing a shared host into swap."""
    with open("/proc/self/statm") as statm:
        mapped_bytes = int(statm.read().split()[0]) * resource.getpagesize()
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    soft = mapped_bytes + budget_bytes
    resource.setrlimit(resource.RLIMIT_AS, (soft if hard < 0 else min(soft, hard), hard))
    return budget_bytes


def memory_to_fill(device: torch.device) -> int:
    """The GPU's memory; on CPU, a budget this process is then held to."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    torch.ones(1 << 20).sum()  # start the CPU thread pool first: its stacks count as memory too
    return limit_host_memory(HOST_BUDGET_BYTES)


def main() -> None:
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    # The batch's activations alone are twice the memory there is.
    points_per_batch = 2 * memory_to_fill(device) // ACTIVATION_BYTES_PER_POINT
    model = CoordinateMLP().to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=5e-4)
    print(f"training on {device} with {points_per_batch:,} points per batch", flush=True)

    for step in range(1, STEPS + 1):
        points = torch.rand(points_per_batch, 3, device=device)
        target = torch.rand(points_per_batch, 4, device=device)
        loss = F.mse_loss(model(points), target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % 10 == 0:
            print(f"step {step}: loss {loss.item():.4f}", flush=True)


if __name__ == "__main__":
    main()
