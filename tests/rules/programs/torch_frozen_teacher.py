"""Distillation on CPU under an address-space cap, for the fixtures of a model run for
inference with autograd on: a frozen teacher (in evaluation mode, its weights still
requiring gradients) scores each batch before the small student learns from it.

- `TEACHER=recording` (the hit): the teacher runs without `torch.no_grad()`, so autograd
  records its forward and keeps every layer's activations: the first step runs out inside
  the teacher.
- `TEACHER=no_grad` (the near miss): the teacher runs under `torch.no_grad()` and keeps
  nothing, but its batch is so large that one layer's output alone does not fit: the first
  step runs out inside the teacher all the same.
"""

from __future__ import annotations

import os
import resource

import torch
import torch.nn.functional as F
from torch import nn

BUDGET_BYTES = 384 << 20
WIDTH, LAYERS, CLASSES = 1024, 12, 10
TEACHER = os.environ.get("TEACHER", "recording")
BATCH = 4096 if TEACHER == "recording" else 131072


def cap_address_space(budget_bytes: int) -> None:
    with open("/proc/self/statm") as statm:
        mapped = int(statm.read().split()[0]) * resource.getpagesize()
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    soft = mapped + budget_bytes
    resource.setrlimit(resource.RLIMIT_AS, (soft if hard < 0 else min(soft, hard), hard))


def teacher_model() -> nn.Module:
    layers: list[nn.Module] = [nn.Linear(64, WIDTH), nn.GELU()]
    for _ in range(LAYERS):
        layers += [nn.Linear(WIDTH, WIDTH), nn.GELU()]
    return nn.Sequential(*layers, nn.Linear(WIDTH, CLASSES))


def main() -> None:
    torch.manual_seed(0)
    torch.ones(1 << 20).sum()  # start the thread pool before the cap: its stacks count
    torch.backends.mkldnn.enabled = False
    teacher = teacher_model().eval()  # frozen, but its weights still require gradients
    student = nn.Sequential(
        nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 256), nn.GELU(), nn.Linear(256, CLASSES)
    )
    optimizer = torch.optim.SGD(student.parameters(), lr=0.01)
    cap_address_space(BUDGET_BYTES)
    generator = torch.Generator().manual_seed(1)
    for _ in range(20):
        inputs = torch.randn((BATCH, 64), generator=generator)
        if TEACHER == "recording":
            soft = teacher(inputs).softmax(-1)
        else:
            with torch.no_grad():
                soft = teacher(inputs).softmax(-1)
        loss = F.kl_div(student(inputs).log_softmax(-1), soft, reduction="batchmean")
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()


if __name__ == "__main__":
    main()
