"""Gradient accumulation done wrong, on CPU under an address-space cap, for the fixtures of a
step whose working set runs out while computing its loss: the losses of all micro-batches
are summed and backward runs once, so every micro-batch's logits and log-probabilities
(16 MiB each) stay alive until then, and the loss of the eleventh runs out.

- `LOSSES=summed` (the hit): the first step runs out in `F.cross_entropy`, asking for one
  micro-batch's log-probabilities, a sliver of what the program holds.
- `LOSSES=broadcast` (the near miss): one micro-batch whose loss compares (N, 1) predictions
  with (N,) targets, which broadcast to an N x N matrix: the loss asks for 4 GiB at once.
"""

from __future__ import annotations

import os
import resource

import torch
import torch.nn.functional as F
from torch import nn

LOSSES = os.environ.get("LOSSES", "summed")
BUDGET_BYTES = int(os.environ.get("BUDGET_MIB", "330")) << 20
FEATURES, CLASSES, MICRO, MICROBATCHES = 64, 8192, 512, 16


def cap_address_space(budget_bytes: int) -> None:
    with open("/proc/self/statm") as statm:
        mapped = int(statm.read().split()[0]) * resource.getpagesize()
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    soft = mapped + budget_bytes
    resource.setrlimit(resource.RLIMIT_AS, (soft if hard < 0 else min(soft, hard), hard))


def main() -> None:
    torch.manual_seed(0)
    torch.ones(1 << 20).sum()  # start the thread pool before the cap: its stacks count
    torch.backends.mkldnn.enabled = False
    model = nn.Linear(FEATURES, CLASSES)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    generator = torch.Generator().manual_seed(1)
    batches = [torch.randn((MICRO, FEATURES), generator=generator) for _ in range(MICROBATCHES)]
    cap_address_space(BUDGET_BYTES)
    if LOSSES == "summed":
        labels = torch.randint(0, CLASSES, (MICRO,), generator=generator)
        total = sum(F.cross_entropy(model(x), labels) for x in batches)
    else:
        rows = 32768
        predictions = nn.Linear(FEATURES, 1)(torch.randn((rows, FEATURES))).reshape(rows, 1)
        total = F.mse_loss(predictions, torch.randn(rows))  # (N, 1) against (N,): N x N
    optimizer.zero_grad(set_to_none=True)
    total.backward()
    optimizer.step()


if __name__ == "__main__":
    main()
