"""Data-parallel training of a text classifier on two ranks (torchrun, gloo, CPU), with
rank 0 evaluating on the held-out set every 20 steps while rank 1 waits at a barrier.

The evaluation is hand-written and forgets `torch.no_grad()`: rank 0 keeps each
evaluation batch's probabilities with their graph (the per-token hidden activations of the
batch), and its memory grows batch after batch through the first evaluation until it runs
out. Rank 1 then fails at the barrier, its peer gone. Training alone fits with room to
spare, and so does the evaluation under `torch.no_grad()`.
"""

from __future__ import annotations

import resource

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel

BUDGET_BYTES = 512 << 20  # per rank: as on a machine with 1 GiB to spare for two ranks
VOCAB, SEQ, DIM, CLASSES = 20000, 256, 64, 4
BATCH, EVAL_BATCH, HELD_ROWS, STEPS, EVAL_EVERY = 32, 512, 8192, 60, 20


def cap_address_space(budget_bytes: int) -> None:
    """Allow this process `budget_bytes` more address space, so it fails in seconds."""
    with open("/proc/self/statm") as statm:
        mapped = int(statm.read().split()[0]) * resource.getpagesize()
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    soft = mapped + budget_bytes
    resource.setrlimit(resource.RLIMIT_AS, (soft if hard < 0 else min(soft, hard), hard))


def make_rows(count: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Stands in for tokenised documents: the label shifts which words are common."""
    labels = torch.randint(CLASSES, (count,), generator=generator)
    words = torch.randint(VOCAB // 2, (count, SEQ), generator=generator)
    words[:, ::4] += (VOCAB // 2) * (labels[:, None] % 2)
    return words, labels


class TextClassifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.token_mlp = nn.Sequential(nn.Linear(DIM, DIM), nn.GELU())
        self.head = nn.Linear(DIM, CLASSES)

    def forward(self, words: torch.Tensor) -> torch.Tensor:
        return self.head(self.token_mlp(self.embed(words)).mean(dim=1))


def evaluate(model: nn.Module, words: torch.Tensor, labels: torch.Tensor) -> float:
    model.eval()
    probabilities = []
    for start in range(0, len(words), EVAL_BATCH):  # BUG: no torch.no_grad()
        probabilities.append(model(words[start : start + EVAL_BATCH]).softmax(-1))
    model.train()
    return (torch.cat(probabilities).argmax(-1) == labels).float().mean().item()


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    torch.ones(1 << 20).sum()  # start the thread pool before the cap: its stacks count
    # oneDNN reports a failed allocation as "could not create a primitive"; the plain kernels
    # raise the allocator's own error, as on a GPU.
    torch.backends.mkldnn.enabled = False
    net = TextClassifier()
    model = DistributedDataParallel(net)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    cap_address_space(BUDGET_BYTES)
    generator = torch.Generator().manual_seed(1 + rank)
    held = make_rows(HELD_ROWS, torch.Generator().manual_seed(99)) if rank == 0 else None
    for step in range(1, STEPS + 1):
        words, labels = make_rows(BATCH, generator)
        loss = F.cross_entropy(model(words), labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if step % EVAL_EVERY == 0:
            if rank == 0:
                accuracy = evaluate(net, *held)
                print(f"step {step}: held-out accuracy {accuracy:.3f}", flush=True)
            dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
