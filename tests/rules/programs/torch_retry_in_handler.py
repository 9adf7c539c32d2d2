"""A hand-written batch-size search on a small convolutional network, under an address-space
cap, for the leak rule's fixtures of retries made inside an `except` block.

- `RETRY=inside` (the hit): the search calls itself at half the batch from inside the
  `except` block of the try that ran out, so every failed try's traceback, with its frames
  and the feature maps they hold, stays alive through the tries after it: each smaller batch
  runs out beside them, down to the smallest, and the last error ends the run.
- `RETRY=after` (the near miss): the same search retries once it has left the `except`
  block; the failed tries are freed, a smaller batch fits and the run trains to its end.
"""

from __future__ import annotations

import os
import resource

import torch
import torch.nn.functional as F
from torch import nn

BUDGET_BYTES = 448 << 20
SIDE, CLASSES = 64, 10
FIRST_BATCH, SMALLEST_BATCH = 512, 16
RETRY = os.environ.get("RETRY", "inside")


def cap_address_space(budget_bytes: int) -> None:
    with open("/proc/self/statm") as statm:
        mapped = int(statm.read().split()[0]) * resource.getpagesize()
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    soft = mapped + budget_bytes
    resource.setrlimit(resource.RLIMIT_AS, (soft if hard < 0 else min(soft, hard), hard))


def is_out_of_memory(error: BaseException) -> bool:
    return isinstance(error, RuntimeError) and "can't allocate memory" in str(error)


def train(model: nn.Module, batch_size: int, steps: int = 3) -> None:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    generator = torch.Generator().manual_seed(batch_size)
    for _ in range(steps):
        images = torch.rand((batch_size, 3, SIDE, SIDE), generator=generator)
        labels = torch.randint(CLASSES, (batch_size,), generator=generator)
        loss = F.cross_entropy(model(images), labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()


def search_inside(model: nn.Module, batch_size: int) -> int:
    try:
        train(model, batch_size)
        return batch_size
    except RuntimeError as error:
        if not is_out_of_memory(error) or batch_size <= SMALLEST_BATCH:
            raise
        return search_inside(model, batch_size // 2)  # the failed try is still in hand


def search_after(model: nn.Module, batch_size: int) -> int:
    while True:
        try:
            train(model, batch_size)
            return batch_size
        except RuntimeError as error:
            if not is_out_of_memory(error) or batch_size <= SMALLEST_BATCH:
                raise
        batch_size //= 2


def main() -> None:
    torch.manual_seed(0)
    torch.ones(1 << 20).sum()  # start the thread pool before the cap: its stacks count
    torch.backends.mkldnn.enabled = False
    cap_address_space(BUDGET_BYTES)
    model = nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(32, 32, 3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(32, CLASSES),
    )
    search = search_inside if RETRY == "inside" else search_after
    print("trained at", search(model, FIRST_BATCH))


if __name__ == "__main__":
    main()
