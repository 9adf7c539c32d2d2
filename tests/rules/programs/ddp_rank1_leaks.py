"""Two DDP ranks on CPU (gloo) under torchrun; rank 1 keeps 4 MiB and its output every step.

The program behind leak-across-steps/hit-ddp-rank1-grows.memdoc: each rank caps its own
address space 600 MiB above what it maps after start, so rank 1 dies in about 90 steps."""

import resource

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.ones(1 << 20).sum()
with open("/proc/self/statm") as f:
    mapped = int(f.read().split()[0]) * resource.getpagesize()
resource.setrlimit(
    resource.RLIMIT_AS, (mapped + (600 << 20), resource.getrlimit(resource.RLIMIT_AS)[1])
)
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(256, 256))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
kept = []
for step in range(400):
    out = model(torch.randn(64, 256))
    loss = out.pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    if rank == 1:
        kept.append(torch.randn(4 << 20 >> 2))  # 4 MiB a step, rank 1 only
        kept.append(out)
print(rank, "done")
