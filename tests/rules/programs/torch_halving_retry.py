"""A hand-written "halve the batch on OOM" retry loop on a small PyTorch language model, under
an address-space cap, for the leak rule's fixtures of memory that fills and is then held.

- `KEEP=logits` (the hit): every step's logits are kept, with their graphs, across retries.
  The first batch size fills the memory over a couple of dozen steps and runs out; each
  smaller one reuses what the failed attempt freed, holds the memory about level for a
  dozen steps and runs out in turn, until the loop gives up.
- `KEEP=buffer` (the near miss): nothing is kept step by step; at step 12 the loop builds
  one lookup buffer of most of what is left, holds it, and at step 30 one allocation larger
  than the rest ends the run: filled at once, not step after step.
"""

from __future__ import annotations

import os
import resource

import torch
import torch.nn.functional as F
from torch import nn

BUDGET_BYTES = 512 << 20
VOCAB, SEQ, HIDDEN = 1000, 64, 64
STEPS = 300
FIRST_BATCH, SMALLEST_BATCH = 64, 8
KEEP = os.environ.get("KEEP", "logits")


def cap_address_space(budget_bytes: int) -> None:
    with open("/proc/self/statm") as statm:
        mapped = int(statm.read().split()[0]) * resource.getpagesize()
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    soft = mapped + budget_bytes
    resource.setrlimit(resource.RLIMIT_AS, (soft if hard < 0 else min(soft, hard), hard))


class TinyLanguageModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, HIDDEN)
        self.body = nn.Sequential(nn.Linear(HIDDEN, 4 * HIDDEN), nn.GELU())
        self.head = nn.Linear(4 * HIDDEN, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(self.embed(tokens)))


def is_out_of_memory(error: BaseException) -> bool:
    return isinstance(error, RuntimeError) and "can't allocate memory" in str(error)


def main() -> None:
    torch.manual_seed(0)
    torch.ones(1 << 20).sum()  # start the thread pool before the cap: its stacks count
    torch.backends.mkldnn.enabled = False
    cap_address_space(BUDGET_BYTES)
    model = TinyLanguageModel()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    kept: list[torch.Tensor] = []

    def train(batch_size: int) -> None:
        generator = torch.Generator().manual_seed(1)
        for step in range(1, STEPS + 1):
            tokens = torch.randint(VOCAB, (batch_size, SEQ + 1), generator=generator)
            logits = model(tokens[:, :-1])
            loss = F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            if KEEP == "logits":
                kept.append(logits)  # the leak
            elif step == 12:
                kept.append(torch.ones(200 << 20, dtype=torch.uint8))  # one buffer, held
            elif step == 30:
                torch.ones(1 << 30, dtype=torch.uint8)  # larger than what is left

    batch_size = FIRST_BATCH
    while True:
        try:
            train(batch_size)
            break
        except RuntimeError as error:
            if not is_out_of_memory(error) or batch_size <= SMALLEST_BATCH or KEEP != "logits":
                raise
            batch_size //= 2


if __name__ == "__main__":
    main()
