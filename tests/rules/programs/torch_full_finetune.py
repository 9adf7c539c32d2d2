"""Fine-tuning on CPU under an address-space cap, for the fixtures of a model too large to
train: whether the first step runs out because of the weights or because of the batch.

- `MODEL=large` (the hit): a 192 MiB stack of linear layers, every weight trainable, on a
  batch of 8; the weights fit under the 320 MiB the program has, but their gradients do not:
  the first backward pass runs out, with the weights and gradients nearly all it held.
- `MODEL=small` (the near miss): a 4 MiB model on a batch of 32768 rows, whose activations
  kept for backward do not fit: the first step runs out too, with the model a sliver of it.
"""

from __future__ import annotations

import os
import resource

import torch
import torch.nn.functional as F
from torch import nn

BUDGET_BYTES = 320 << 20
MODEL = os.environ.get("MODEL", "large")
WIDTH, HIDDEN, LAYERS = (1024, 4096, 6) if MODEL == "large" else (256, 1024, 2)
BATCH = 8 if MODEL == "large" else 32768


def cap_address_space(budget_bytes: int) -> None:
    with open("/proc/self/statm") as statm:
        mapped = int(statm.read().split()[0]) * resource.getpagesize()
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    soft = mapped + budget_bytes
    resource.setrlimit(resource.RLIMIT_AS, (soft if hard < 0 else min(soft, hard), hard))


def pretrained() -> nn.Module:
    """Stands in for a loaded checkpoint: blocks of up- and down-projections."""
    layers: list[nn.Module] = []
    for _ in range(LAYERS):
        layers += [nn.Linear(WIDTH, HIDDEN), nn.GELU(), nn.Linear(HIDDEN, WIDTH)]
    return nn.Sequential(*layers, nn.Linear(WIDTH, 2))


def main() -> None:
    torch.manual_seed(0)
    torch.ones(1 << 20).sum()  # start the thread pool before the cap: its stacks count
    torch.backends.mkldnn.enabled = False
    cap_address_space(BUDGET_BYTES)
    model = pretrained()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    generator = torch.Generator().manual_seed(1)
    for _ in range(5):
        inputs = torch.randn((BATCH, WIDTH), generator=generator)
        labels = torch.randint(0, 2, (BATCH,), generator=generator)
        loss = F.cross_entropy(model(inputs), labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()


if __name__ == "__main__":
    main()
