"""Pick the batch of a review classifier with accelerate's `find_executable_batch_size`,
around a function that trains an epoch and then validates without `torch.no_grad()`.

The decorated function trains one epoch at the batch size it is given, then scores the
4096 held-out reviews at the same batch size, in `eval()` mode but with autograd on, and
keeps every batch's probabilities for the accuracy. Each kept probability tensor holds its
batch's graph, with the activations saved for a backward pass that never comes: about
390 KiB a review of 512 tokens (the normalised, projected and activated token features),
some 1.5 GiB for the whole held-out set, which is the same whatever the batch. So every try
runs out partway through validation, the finder takes a tenth off the batch, from 16 down
to 1, and every size runs out the same way until it gives up at zero, though training at
16 needs a few dozen MiB. (Validate under `torch.no_grad()`: the held-out probabilities
are 32 KiB, and the first try, at 16, trains and validates under the same cap.)
"""

from __future__ import annotations

import ctypes
import resource

import torch
import torch.nn.functional as F
from accelerate import Accelerator
from accelerate.utils import find_executable_batch_size
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

BUDGET_BYTES = 256 << 20  # as on a machine with 256 MiB to spare
VOCAB, SEQ, WIDTH, CLASSES, TRAIN, HELD_OUT = 8000, 512, 64, 2, 128, 4096


def cap_address_space(budget_bytes: int) -> None:
    """Allow this process `budget_bytes` more address space, so it fails in seconds."""
    with open("/proc/self/statm") as statm:
        mapped = int(statm.read().split()[0]) * resource.getpagesize()
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    soft = mapped + budget_bytes
    resource.setrlimit(resource.RLIMIT_AS, (soft if hard < 0 else min(soft, hard), hard))


def make_reviews(count: int, seed: int) -> TensorDataset:
    """Stands in for tokenised reviews: positive ones use the first 500 words more."""
    generator = torch.Generator().manual_seed(seed)
    labels = torch.randint(CLASSES, (count,), generator=generator)
    tokens = torch.randint(500, VOCAB, (count, SEQ), generator=generator)
    cue = (torch.rand((count, SEQ), generator=generator) < 0.1) & (labels[:, None] == 1)
    tokens[cue] %= 500
    return TensorDataset(tokens, labels)


class ReviewClassifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.position = nn.Parameter(torch.zeros(SEQ, WIDTH))
        self.norm = nn.LayerNorm(WIDTH)
        self.mix = nn.Linear(WIDTH, WIDTH)
        self.head = nn.Linear(WIDTH, CLASSES)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        hidden = self.norm(self.embed(tokens) + self.position)
        hidden = hidden + F.gelu(self.mix(hidden))
        return self.head(hidden.mean(dim=1))


def main() -> None:
    # Allocations of 128 KiB and more get their own mappings, returned when freed, as a
    # device's caching allocator keeps large blocks apart from small ones: otherwise each
    # small tensor kept on glibc's heap can pin a megabyte of freed activations around it.
    ctypes.CDLL("libc.so.6").mallopt(-3, 128 << 10)  # M_MMAP_THRESHOLD
    torch.manual_seed(0)
    accelerator = Accelerator(cpu=True)
    torch.ones(1 << 20).sum()  # start the thread pool before the cap: its stacks count
    # oneDNN reports a failed allocation as "could not create a primitive"; the plain kernels
    # raise the allocator's own error, as on a GPU.
    torch.backends.mkldnn.enabled = False
    cap_address_space(BUDGET_BYTES)
    train_set, held_out = make_reviews(TRAIN, seed=0), make_reviews(HELD_OUT, seed=1)

    @find_executable_batch_size(starting_batch_size=16)
    def train_and_validate(batch_size: int) -> float:
        accelerator.free_memory()
        print(f"trying batch size {batch_size}", flush=True)
        model = ReviewClassifier()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        train_loader = DataLoader(train_set, batch_size=batch_size, shuffle=True)
        held_loader = DataLoader(held_out, batch_size=batch_size)
        model, optimizer, train_loader, held_loader = accelerator.prepare(
            model, optimizer, train_loader, held_loader
        )
        model.train()
        for tokens, labels in train_loader:
            loss = F.cross_entropy(model(tokens), labels)
            optimizer.zero_grad(set_to_none=True)
            accelerator.backward(loss)
            optimizer.step()
        print(f"batch size {batch_size}: trained an epoch, loss {loss.item():.3f}", flush=True)
        model.eval()
        probabilities, answers = [], []
        for tokens, labels in held_loader:
            probabilities.append(model(tokens).softmax(dim=-1))  # BUG: autograd still on
            answers.append(labels)
        predicted = torch.cat(probabilities).argmax(dim=-1)
        return (predicted == torch.cat(answers)).float().mean().item()

    print(f"held-out accuracy {train_and_validate():.3f}")


if __name__ == "__main__":
    main()
