"""Train a tabular classifier, then validate it with a larger batch but without no_grad.

The bug: `evaluate` calls `model.eval()` and assumes that turns autograd off. It does not:
every validation forward pass still saves its activations for a backward pass that never
comes. The validation batch was made 4x the training batch because "evaluation needs no
gradients", so validation needs about 4x the memory of a training step, and runs out.
"""

from __future__ import annotations

import resource

import torch
import torch.nn.functional as F
from torch import nn

HOST_BUDGET_BYTES = 384 << 20  # on CPU: run as if on a machine with 384 MiB to spare
FEATURES, HIDDEN, DEPTH, CLASSES = 32, 64, 6, 10
# Autograd saves about this much per sample in a forward pass (measured on this model).
ACTIVATION_BYTES_PER_SAMPLE = DEPTH * 3 * HIDDEN * 4
TRAIN_STEPS = 6
EVAL_BATCHES = 4


def make_model() -> nn.Module:
    layers: list[nn.Module] = [nn.Linear(FEATURES, HIDDEN)]
    for _ in range(DEPTH):
        layers += [nn.LayerNorm(HIDDEN), nn.GELU(), nn.Linear(HIDDEN, HIDDEN)]
    layers.append(nn.Linear(HIDDEN, CLASSES))
    return nn.Sequential(*layers)


def random_batch(size: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    inputs = torch.randn(size, FEATURES, device=device)
    return inputs, torch.randint(CLASSES, (size,), device=device)


def train(model: nn.Module, batch_size: int, device: torch.device) -> None:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model.train()
    for step in range(1, TRAIN_STEPS + 1):
        inputs, targets = random_batch(batch_size, device)
        loss = F.cross_entropy(model(inputs), targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        print(f"step {step}: loss {loss.item():.3f}", flush=True)


def evaluate(model: nn.Module, batch_size: int, device: torch.device) -> float:
    model.eval()  # BUG: eval() changes dropout and batch norm, not autograd: use torch.no_grad()
    total_loss = 0.0
    for _ in range(EVAL_BATCHES):
        inputs, targets = random_batch(batch_size, device)
        total_loss += F.cross_entropy(model(inputs), targets).item()
    return total_loss / EVAL_BATCHES


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
    # A training step's activations take a third of the memory; validation, at 4x the batch,
    # would need 4/3 of it.
    train_batch = memory_to_fill(device) // 3 // ACTIVATION_BYTES_PER_SAMPLE
    eval_batch = 4 * train_batch
    model = make_model().to(device)
    train(model, train_batch, device)
    print(f"validation loss: {evaluate(model, eval_batch, device):.3f}")


if __name__ == "__main__":
    main()
