"""Data-parallel training of a review classifier on two ranks (torchrun, gloo, CPU), where
rank 0 alone keeps the whole held-out set for its periodic evaluation.

Both ranks train the same model on their halves of the training stream: each step's
working set, with the weights, their gradients, DDP's buckets and Adam's moments, is about
200 MiB on either rank. Rank 0 also evaluates every 50 steps, and to do it fast it builds
the tokenised held-out set once, before training, and keeps it (131,072 reviews of 512
int64 token ids, 512 MiB) as one tensor for the whole run. That is more than rank 0 has
left for a training step: rank 0 runs out in its first step, while rank 1, using well under
half as much, waits for it in the gradients' all-reduce. (Let each rank keep and
score its own half of the held-out set and all-reduce the counts: 256 MiB more on each
rank, and both train under the same cap.)
"""

from __future__ import annotations

import resource

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel

BUDGET_BYTES = 640 << 20  # per rank: as on a machine with 1.25 GiB to spare for two ranks
VOCAB, SEQ, WIDTH, CLASSES, BATCH, STEPS, EVERY = 30_000, 512, 128, 2, 32, 200, 50
HELD_OUT = 131_072


def cap_address_space(budget_bytes: int) -> None:
    """Allow this process `budget_bytes` more address space, so it fails in seconds."""
    with open("/proc/self/statm") as statm:
        mapped = int(statm.read().split()[0]) * resource.getpagesize()
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    soft = mapped + budget_bytes
    resource.setrlimit(resource.RLIMIT_AS, (soft if hard < 0 else min(soft, hard), hard))


class ReviewClassifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.norm = nn.LayerNorm(WIDTH)
        self.widen = nn.Linear(WIDTH, 2 * WIDTH)
        self.narrow = nn.Linear(2 * WIDTH, WIDTH)
        self.head = nn.Linear(WIDTH, CLASSES)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        hidden = self.embed(tokens)
        hidden = hidden + self.narrow(F.gelu(self.widen(self.norm(hidden))))
        return self.head(hidden.mean(dim=1))


def make_reviews(count: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Stands in for tokenised reviews: positive ones use the first thousand words more."""
    labels = torch.randint(CLASSES, (count,), generator=generator)
    tokens = torch.randint(1000, VOCAB, (count, SEQ), generator=generator)
    tokens[:, ::8] -= 1000 * labels[:, None]
    return tokens, labels


@torch.no_grad()
def evaluate(model: nn.Module, tokens: torch.Tensor, labels: torch.Tensor) -> float:
    right = 0
    for start in range(0, len(tokens), BATCH):
        logits = model(tokens[start : start + BATCH])
        right += int((logits.argmax(dim=-1) == labels[start : start + BATCH]).sum())
    return right / len(tokens)


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    torch.ones(1 << 20).sum()  # start the thread pool before the cap: its stacks count
    # oneDNN reports a failed allocation as "could not create a primitive"; the plain kernels
    # raise the allocator's own error, as on a GPU.
    torch.backends.mkldnn.enabled = False
    model = DistributedDataParallel(ReviewClassifier())
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    cap_address_space(BUDGET_BYTES)
    if rank == 0:
        # BUG: rank 0 alone keeps the whole held-out set for the whole run
        held_tokens, held_labels = make_reviews(HELD_OUT, torch.Generator().manual_seed(99))
        print(f"rank 0 keeps {held_tokens.nbytes >> 20} MiB of held-out reviews", flush=True)
    generator = torch.Generator().manual_seed(1 + rank)
    for step in range(1, STEPS + 1):
        tokens, labels = make_reviews(BATCH, generator)
        loss = F.cross_entropy(model(tokens), labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if rank == 0 and step % 10 == 0:
            print(f"step {step}: loss {loss.item():.3f}", flush=True)
        if rank == 0 and step % EVERY == 0:
            print(f"step {step}: held-out accuracy {evaluate(model, held_tokens, held_labels):.3f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
