"""Train a news recommender (matrix factorisation with biases) data-parallel on two ranks
(torchrun, gloo, CPU) with AdamW, whose two moments per weight do not fit next to the
model and its gradients on either rank.

The model is a user table and an article table of 393,216 x 64 embeddings each (96 MiB
each, 192 MiB together) and a click logit from their dot product. Every rank holds a full
replica: its weights (192 MiB) and, through DDP with `gradient_as_bucket_view=True`, the
dense gradients of both tables in DDP's buckets (192 MiB more), with the allocator's and
threads' overheads about 590 MiB of address space after the first backward. Then the
first `optimizer.step()` creates AdamW's state, an `exp_avg` and an `exp_avg_sq` for every
weight, 384 MiB more on each rank, and its update of a table needs two table-sized
temporaries (192 MiB) on top: about 1.25 GiB at the step's peak against 1120 MiB per
rank, and both ranks run out in the optimizer's first step, though the forward and
backward passes fit. (Wrap AdamW in `ZeroRedundancyOptimizer`: each rank keeps the
moments of one table only, 192 MiB, the step peaks under 1 GiB, and both ranks train
under the same cap.)
"""

from __future__ import annotations

import resource

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel

BUDGET_BYTES = 1120 << 20  # per rank: as on a machine with 2.2 GiB to spare for two ranks
USERS, ARTICLES, DIM, BATCH, STEPS = 393_216, 393_216, 64, 4096, 40


def cap_address_space(budget_bytes: int) -> None:
    """Allow this process `budget_bytes` more address space, so it fails in seconds."""
    with open("/proc/self/statm") as statm:
        mapped = int(statm.read().split()[0]) * resource.getpagesize()
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    soft = mapped + budget_bytes
    resource.setrlimit(resource.RLIMIT_AS, (soft if hard < 0 else min(soft, hard), hard))


class Factorisation(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.users = nn.Embedding(USERS, DIM)
        self.articles = nn.Embedding(ARTICLES, DIM)
        self.bias = nn.Parameter(torch.zeros(1))
        nn.init.normal_(self.users.weight, std=0.05)
        nn.init.normal_(self.articles.weight, std=0.05)

    def forward(self, users: torch.Tensor, articles: torch.Tensor) -> torch.Tensor:
        return (self.users(users) * self.articles(articles)).sum(dim=-1) + self.bias


def make_clicks(generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Stands in for impression logs: users click articles from their own section."""
    users = torch.randint(USERS, (BATCH,), generator=generator)
    articles = torch.randint(ARTICLES, (BATCH,), generator=generator)
    same_section = users % 12 == articles % 12
    noise = torch.rand(BATCH, generator=generator) < 0.1
    return users, articles, (same_section ^ noise).float()


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    torch.ones(1 << 20).sum()  # start the thread pool before the cap: its stacks count
    # oneDNN reports a failed allocation as "could not create a primitive"; the plain kernels
    # raise the allocator's own error, as on a GPU.
    torch.backends.mkldnn.enabled = False
    cap_address_space(BUDGET_BYTES)
    model = DistributedDataParallel(Factorisation(), gradient_as_bucket_view=True)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0)
    generator = torch.Generator().manual_seed(1 + rank)
    for step in range(1, STEPS + 1):
        users, articles, clicked = make_clicks(generator)
        loss = F.binary_cross_entropy_with_logits(model(users, articles), clicked)
        optimizer.zero_grad(set_to_none=False)  # keep the grads as views of DDP's buckets
        loss.backward()
        optimizer.step()
        if rank == 0 and step % 10 == 0:
            print(f"step {step}: loss {loss.item():.4f}", flush=True)
    dist.destroy_process_group()
    if rank == 0:
        print("training finished")


if __name__ == "__main__":
    main()
