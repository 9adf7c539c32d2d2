"""Data-parallel training of a small language model on two ranks (torchrun, gloo, CPU) with
gradient accumulation written as one backward pass over the summed micro-batch losses.

Each optimizer step accumulates 32 micro-batches of 8 sequences. To have DDP all-reduce
once per step, the loop adds each micro-batch's loss to `window_loss` and calls
`window_loss.backward()` once, after the 32nd forward pass. Until then every micro-batch's
graph stays alive with what it saved for backward, and each rank's memory grows by about
30 MiB a micro-batch (the log-probabilities, 8 x 128 tokens x a 4000-word vocabulary, are
16 MB of it): close to 1 GiB for the window. Each rank's weights, gradients and Adam's
moments need a few MB, but the window's working set is more than the memory there is, and
both ranks run out in the forward passes of their first window, after about 15
micro-batches. (Call `(loss / 32).backward()` after each micro-batch, inside
`model.no_sync()` for all but the last, so DDP still all-reduces once per step: one
micro-batch's graph is alive at a time, and the same steps train under the same cap.)
"""

from __future__ import annotations

import resource

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel

BUDGET_BYTES = 512 << 20  # per rank: as on a machine with 1 GiB to spare for two ranks
VOCAB, SEQ, HIDDEN, MICRO_BATCH, ACCUMULATION, STEPS = 4000, 128, 64, 8, 32, 20


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
        self.mix = nn.GRU(HIDDEN, HIDDEN, batch_first=True)
        self.head = nn.Linear(HIDDEN, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        hidden, _ = self.mix(self.embed(tokens))
        return self.head(hidden)


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
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    cap_address_space(BUDGET_BYTES)
    generator = torch.Generator().manual_seed(1 + rank)
    for step in range(1, STEPS + 1):
        window_loss = torch.zeros(())
        for micro in range(ACCUMULATION):
            tokens = torch.randint(VOCAB, (MICRO_BATCH, SEQ + 1), generator=generator)
            logits = model(tokens[:, :-1])
            loss = F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
            # BUG: every micro-batch's graph stays alive until the one backward below
            window_loss = window_loss + loss / ACCUMULATION
            if rank == 0 and step == 1 and micro % 4 == 0:
                print(f"step 1, micro-batch {micro}", flush=True)
        optimizer.zero_grad(set_to_none=True)
        window_loss.backward()
        optimizer.step()
        if rank == 0:
            print(f"step {step}: loss {window_loss.item():.3f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
