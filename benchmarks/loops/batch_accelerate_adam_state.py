"""Train a bag-of-words classifier with accelerate's `find_executable_batch_size`, where no
batch size can help: AdamW's state is what does not fit.

The model is one large embedding table (300,000 words x 128, 146 MiB of float32) and a
small head, built with its AdamW optimizer inside the function the finder retries, as the
finder asks. At every batch size the weights and the gradients fit, and the first
`optimizer.step()` runs out while creating AdamW's two state tensors per parameter
(another 293 MiB). The finder takes each of these for a batch that is too large: it
shrinks the batch from 16 to 1, failing at the same place every time, and gives up at
zero. (SGD, a sparse or 8-bit optimizer, or a smaller vocabulary would train.)
"""

from __future__ import annotations

import resource

import torch
import torch.nn.functional as F
from accelerate.utils import find_executable_batch_size
from torch import nn

BUDGET_BYTES = 512 << 20  # as on a machine with 512 MiB to spare
VOCAB, DIM, CLASSES, WORDS, STEPS = 300_000, 128, 4, 32, 20


def cap_address_space(budget_bytes: int) -> None:
    """Allow this process `budget_bytes` more address space, so it fails in seconds."""
    with open("/proc/self/statm") as statm:
        mapped = int(statm.read().split()[0]) * resource.getpagesize()
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    soft = mapped + budget_bytes
    resource.setrlimit(resource.RLIMIT_AS, (soft if hard < 0 else min(soft, hard), hard))


class BagOfWords(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.EmbeddingBag(VOCAB, DIM, mode="mean")
        self.head = nn.Linear(DIM, CLASSES)

    def forward(self, words: torch.Tensor) -> torch.Tensor:
        return self.head(self.embed(words))


def main() -> None:
    torch.manual_seed(0)
    torch.ones(1 << 20).sum()  # start the thread pool before the cap: its stacks count
    # oneDNN reports a failed allocation as "could not create a primitive"; the plain kernels
    # raise the allocator's own error, as on a GPU.
    torch.backends.mkldnn.enabled = False
    cap_address_space(BUDGET_BYTES)

    @find_executable_batch_size(starting_batch_size=16)
    def train(batch_size: int) -> int:
        print(f"trying batch size {batch_size}", flush=True)
        model = BagOfWords()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        generator = torch.Generator().manual_seed(1)
        for step in range(1, STEPS + 1):
            words = torch.randint(VOCAB, (batch_size, WORDS), generator=generator)
            labels = torch.randint(CLASSES, (batch_size,), generator=generator)
            loss = F.cross_entropy(model(words), labels)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            if step % 5 == 0:
                print(f"step {step}: loss {loss.item():.3f}", flush=True)
        return batch_size

    print(f"trained at batch size {train()}")


if __name__ == "__main__":
    main()
