"""Train a small language model behind a hand-written "halve the batch on OOM" retry loop.

The retry loop hides a leak: `kept_logits.append(logits)` keeps every step's logits (for an
accuracy computed at the end), across retries too. The first size runs out after a few dozen
steps, each smaller size runs out sooner, and below the smallest size the loop gives up and
the out-of-memory error ends the run.
"""

from __future__ import annotations

import resource

import torch
import torch.nn.functional as F
from torch import nn

BUDGET_BYTES = 512 << 20  # as on a machine with 512 MiB to spare
VOCAB, SEQ, HIDDEN = 1000, 64, 64
STEPS = 300
FIRST_BATCH, SMALLEST_BATCH = 64, 8


def cap_address_space(budget_bytes: int) -> None:
    """Allow this process `budget_bytes` more address space, so it fails in seconds."""
    with open("/proc/self/statm") as statm:
        mapped = int(statm.read().split()[0]) * resource.getpagesize()
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    soft = mapped + budget_bytes
    resource.setrlimit(resource.RLIMIT_AS, (soft if hard < 0 else min(soft, hard), hard))


class TinyLanguageModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, HIDDEN)
        self.body = nn.Sequential(
            nn.Linear(HIDDEN, 4 * HIDDEN), nn.GELU(), nn.Linear(4 * HIDDEN, HIDDEN), nn.GELU()
        )
        self.head = nn.Linear(HIDDEN, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(self.embed(tokens)))


def is_out_of_memory(error: BaseException) -> bool:
    return isinstance(error, RuntimeError) and "can't allocate memory" in str(error)


def main() -> None:
    torch.manual_seed(0)
    torch.ones(1 << 20).sum()  # start the thread pool before the cap: its stacks count
    # oneDNN reports a failed allocation as "could not create a primitive"; the plain kernels
    # raise the allocator's own error, as on a GPU.
    torch.backends.mkldnn.enabled = False
    cap_address_space(BUDGET_BYTES)
    model = TinyLanguageModel()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    kept_logits: list[torch.Tensor] = []  # for the accuracy at the end
    kept_targets: list[torch.Tensor] = []

    def train(batch_size: int) -> None:
        generator = torch.Generator().manual_seed(1)
        for step in range(1, STEPS + 1):
            tokens = torch.randint(VOCAB, (batch_size, SEQ + 1), generator=generator)
            inputs, targets = tokens[:, :-1], tokens[:, 1:]
            logits = model(inputs)
            loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten())
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            kept_logits.append(logits)  # BUG: keeps every step's logits (count hits instead)
            kept_targets.append(targets)
            if step % 10 == 0:
                print(f"batch {batch_size} step {step}: loss {loss.item():.3f}", flush=True)

    batch_size = FIRST_BATCH
    while True:
        try:
            train(batch_size)
            break
        except RuntimeError as error:
            if not is_out_of_memory(error) or batch_size <= SMALLEST_BATCH:
                raise
            print(f"out of memory at batch size {batch_size}; halving", flush=True)
            batch_size //= 2
    pairs = zip(kept_logits, kept_targets, strict=True)
    hits = sum((logits.argmax(-1) == targets).sum().item() for logits, targets in pairs)
    accuracy = hits / sum(targets.numel() for targets in kept_targets)
    print(f"trained at batch size {batch_size}, accuracy {accuracy:.3f}")


if __name__ == "__main__":
    main()
