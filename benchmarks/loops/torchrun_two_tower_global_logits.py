"""Train a two-tower retrieval model on two ranks (torchrun, gloo, CPU) with in-batch
negatives gathered from every rank, scored as one global logits matrix.

A query tower (hashed query words, mean-pooled, then an MLP) and an item tower (item id and
category embeddings, then an MLP) map each to 64 floats; each (query, clicked item) pair
is a positive and every other item in the batch a negative. More negatives train better
retrieval, so the author uses a per-rank batch of 16,384 and gathers both towers' outputs
from all ranks with the differentiable `torch.distributed.nn.functional.all_gather`.
Then each rank computes the whole global score matrix, all 32,768 queries against all
32,768 items: one 32,768 x 32,768 float tensor, a single 4 GiB request against 640 MiB of
memory, while the towers (41 MiB), their gradients, AdamW's state and the rest of the step
take about 250 MiB. Both ranks run out at that matrix in their first step. (Each rank need
only score its own queries, and in chunks of 1024 (128 MiB each); or use a per-rank batch
of 2048, whose 4096 x 4096 scores take 64 MiB: it trains under the same cap.)
"""

from __future__ import annotations

import resource

import torch
import torch.distributed as dist
import torch.distributed.nn.functional as dist_functional
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel

BUDGET_BYTES = 640 << 20  # per rank: as on a machine with 1.25 GiB to spare for two ranks
WORDS, ITEMS, CATEGORIES, QUERY_LEN, DIM, BATCH, STEPS = 65_536, 100_000, 512, 8, 64, 16_384, 50


def cap_address_space(budget_bytes: int) -> None:
    """Allow this process `budget_bytes` more address space, so it fails in seconds."""
    with open("/proc/self/statm") as statm:
        mapped = int(statm.read().split()[0]) * resource.getpagesize()
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    soft = mapped + budget_bytes
    resource.setrlimit(resource.RLIMIT_AS, (soft if hard < 0 else min(soft, hard), hard))


class TwoTower(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.words = nn.EmbeddingBag(WORDS, DIM, mode="mean")
        self.items = nn.Embedding(ITEMS, DIM)
        self.categories = nn.Embedding(CATEGORIES, DIM)
        self.query_mlp = nn.Sequential(nn.Linear(DIM, 256), nn.ReLU(), nn.Linear(256, DIM))
        self.item_mlp = nn.Sequential(nn.Linear(2 * DIM, 256), nn.ReLU(), nn.Linear(256, DIM))

    def forward(self, query_words, items, categories):
        queries = F.normalize(self.query_mlp(self.words(query_words)), dim=-1)
        joined = torch.cat((self.items(items), self.categories(categories)), dim=-1)
        return queries, F.normalize(self.item_mlp(joined), dim=-1)


def make_clicks(generator: torch.Generator):
    """Stands in for search logs: a query's words name its clicked item's category."""
    items = torch.randint(ITEMS, (BATCH,), generator=generator)
    categories = items % CATEGORIES
    query_words = torch.randint(WORDS, (BATCH, QUERY_LEN), generator=generator)
    query_words[:, :2] = categories[:, None] * 64 + torch.arange(2)
    return query_words, items, categories


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    torch.ones(1 << 20).sum()  # start the thread pool before the cap: its stacks count
    # oneDNN reports a failed allocation as "could not create a primitive"; the plain kernels
    # raise the allocator's own error, as on a GPU.
    torch.backends.mkldnn.enabled = False
    model = DistributedDataParallel(TwoTower())
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    cap_address_space(BUDGET_BYTES)
    generator = torch.Generator().manual_seed(1 + rank)
    for step in range(1, STEPS + 1):
        queries, items = model(*make_clicks(generator))
        all_queries = torch.cat(dist_functional.all_gather(queries))  # (32768, 64)
        all_items = torch.cat(dist_functional.all_gather(items))
        scores = all_queries @ all_items.T / 0.05  # BUG: every query against every item
        loss = F.cross_entropy(scores, torch.arange(len(scores)))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if rank == 0 and step % 5 == 0:
            print(f"step {step}: loss {loss.item():.3f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
