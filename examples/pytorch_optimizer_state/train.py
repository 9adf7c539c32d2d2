"""Fine-tune a model that fits with its gradients, until Adam creates its state.

The bug is a sizing one: the model was checked to fit ("weights and gradients take 60% of the
memory, and a forward pass runs"). But Adam keeps two more tensors the size of the weights
(`exp_avg` and `exp_avg_sq`), created at the first `optimizer.step()`, and those do not fit.
"""

from __future__ import annotations

import resource

import torch
import torch.nn.functional as F
from torch import nn

HOST_BUDGET_BYTES = 768 << 20  # on CPU: run as if on a machine with 768 MiB to spare
BATCH_SIZE = 8
STEPS = 20


def make_model(width: int, depth: int) -> nn.Module:
    layers: list[nn.Module] = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.GELU()]
    return nn.Sequential(*layers)


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
    memory = memory_to_fill(device)
    # Weights take 30% of the memory: with gradients 60%, with Adam's state 120%.
    width = 8192 if device.type == "cuda" else 1024
    depth = max(1, int(0.3 * memory) // (width * width * 4))
    with torch.device(device):
        model = make_model(width, depth)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    weights_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    print(f"{depth} layers, {weights_bytes / 2**30:.2f} GiB of weights on {device}", flush=True)

    for step in range(1, STEPS + 1):
        inputs = torch.randn(BATCH_SIZE, width, device=device)
        loss = F.mse_loss(model(inputs), inputs)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()  # the first call allocates 2x the weights for Adam's moments
        print(f"step {step}: loss {loss.item():.4f}", flush=True)


if __name__ == "__main__":
    main()
