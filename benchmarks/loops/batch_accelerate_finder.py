"""Train a token tagger with accelerate's `find_executable_batch_size` picking the batch.

The search starts at 2048 sequences a batch, more than fits: each try dies in its forward
or backward pass, the finder catches the out-of-memory error, takes a tenth off the batch
and tries again, and the run then trains at the first size that fits and finishes.
"""

from __future__ import annotations

import resource

import torch
import torch.nn.functional as F
from accelerate.utils import find_executable_batch_size
from torch import nn

BUDGET_BYTES = 512 << 20  # as on a machine with 512 MiB to spare
VOCAB, SEQ, HIDDEN, CLASSES = 1000, 64, 64, 8
STEPS = 10


def cap_address_space(budget_bytes: int) -> None:
    """Allow this process `budget_bytes` more address space, so it fails in seconds."""
    with open("/proc/self/statm") as statm:
        mapped = int(statm.read().split()[0]) * resource.getpagesize()
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    soft = mapped + budget_bytes
    resource.setrlimit(resource.RLIMIT_AS, (soft if hard < 0 else min(soft, hard), hard))


class Tagger(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, HIDDEN)
        self.body = nn.Sequential(
            nn.Linear(HIDDEN, 4 * HIDDEN), nn.GELU(), nn.Linear(4 * HIDDEN, HIDDEN), nn.GELU()
        )
        self.head = nn.Linear(HIDDEN, CLASSES)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(self.embed(tokens)))


def main() -> None:
    torch.manual_seed(0)
    torch.ones(1 << 20).sum()  # start the thread pool before the cap: its stacks count
    # oneDNN reports a failed allocation as "could not create a primitive"; the plain kernels
    # raise the allocator's own error, as on a GPU.
    torch.backends.mkldnn.enabled = False
    cap_address_space(BUDGET_BYTES)
    model = Tagger()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

    @find_executable_batch_size(starting_batch_size=2048)
    def train(batch_size: int) -> int:
        print(f"trying batch size {batch_size}", flush=True)
        generator = torch.Generator().manual_seed(1)
        for step in range(1, STEPS + 1):
            tokens = torch.randint(VOCAB, (batch_size, SEQ), generator=generator)
            labels = torch.randint(CLASSES, (batch_size, SEQ), generator=generator)
            logits = model(tokens)
            loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten())
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            if step % 5 == 0:
                print(f"step {step}: loss {loss.item():.3f}", flush=True)
        return batch_size

    print(f"trained at batch size {train()}")


if __name__ == "__main__":
    main()
