"""Data-parallel training of a small language model on two ranks (torchrun, gloo, CPU),
where rank 0 keeps each step's logits for the accuracy it logs.

Only rank 0 logs, so only rank 0 runs `kept_logits.append(logits)`: its memory grows by
one batch of logits (and their graph) a step while rank 1 stays flat. Rank 0 runs out
after a few dozen steps; rank 1 then fails in the next all-reduce, its peer gone.
"""

from __future__ import annotations

import resource

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel

BUDGET_BYTES = 512 << 20  # per rank: as on a machine with 1 GiB to spare for two ranks
VOCAB, SEQ, HIDDEN, BATCH, STEPS = 2000, 64, 64, 16, 400


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
        self.mlp = nn.Sequential(nn.Linear(HIDDEN, HIDDEN), nn.GELU())
        self.head = nn.Linear(HIDDEN, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.mlp(self.embed(tokens)))


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    torch.ones(1 << 20).sum()  # start the thread pool before the cap: its stacks count
    # oneDNN reports a failed allocation as "could not create a primitive"; the plain kernels
    # raise the allocator's own error, as on a GPU.
    torch.backends.mkldnn.enabled = False
    model = DistributedDataParallel(TinyLanguageModel())
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    cap_address_space(BUDGET_BYTES)
    generator = torch.Generator().manual_seed(1 + rank)
    kept_logits: list[torch.Tensor] = []
    kept_targets: list[torch.Tensor] = []
    for step in range(1, STEPS + 1):
        tokens = torch.randint(VOCAB, (BATCH, SEQ + 1), generator=generator)
        inputs, targets = tokens[:, :-1], tokens[:, 1:]
        logits = model(inputs)
        loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if rank == 0:  # only rank 0 logs
            kept_logits.append(logits)  # BUG: keeps every step's logits (count hits instead)
            kept_targets.append(targets)
            if step % 10 == 0:
                pairs = zip(kept_logits, kept_targets, strict=True)
                hits = sum((kept.argmax(-1) == seen).sum().item() for kept, seen in pairs)
                accuracy = hits / (step * BATCH * SEQ)
                print(f"step {step}: loss {loss.item():.3f}, accuracy {accuracy:.4f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
