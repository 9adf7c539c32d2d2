"""Data-parallel training of a small language model on two ranks (torchrun, gloo, CPU),
where each rank sums the epoch's negative log-likelihood as a tensor.

The model trains on a label-smoothed loss; for the perplexity printed at the epoch's end
each rank also computes the plain NLL of the batch and adds it to `total_nll`, a tensor.
That NLL is never backpropagated, so its graph is never freed: `total_nll` holds every
step's graph, each with its batch's log-probabilities (16 x 64 tokens x 2000 words,
8 MiB). Both ranks grow by that much a step; the first to run out, after a few dozen
steps and long before the epoch ends, takes the other down in its next all-reduce. (Add
`nll.item()`, a float, instead.)
"""

from __future__ import annotations

import math
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
        self.mix = nn.Conv1d(HIDDEN, HIDDEN, 4, padding=3)  # causal: trimmed to SEQ below
        self.head = nn.Linear(HIDDEN, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        hidden = self.mix(self.embed(tokens).transpose(1, 2))[..., : tokens.shape[1]]
        return self.head(F.gelu(hidden.transpose(1, 2)))


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
    total_nll = torch.zeros(())
    for step in range(1, STEPS + 1):
        tokens = torch.randint(VOCAB, (BATCH, SEQ + 1), generator=generator)
        inputs, targets = tokens[:, :-1], tokens[:, 1:].flatten()
        logits = model(inputs).flatten(0, 1)
        loss = F.cross_entropy(logits, targets, label_smoothing=0.1)
        # BUG: a tensor sum of a graph nobody backpropagates (use nll.item())
        total_nll += F.cross_entropy(logits, targets, reduction="sum")
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if rank == 0 and step % 10 == 0:
            print(f"step {step}: loss {loss.item():.3f}", flush=True)
    perplexity = math.exp(total_nll.item() / (STEPS * BATCH * SEQ))
    print(f"rank {rank}: epoch perplexity {perplexity:.1f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
