"""accelerate's find_executable_batch_size on CPU: an MLP whose activations take about
96 KiB a sample, under an address-space cap 400 MiB above what the process maps at start.
The finder starts at the batch size in START (default 4096), lowers it by a tenth after each
out-of-memory error, and trains 20 steps at the first size that fits."""

import os
import resource

import torch
from accelerate.utils import find_executable_batch_size

torch.manual_seed(0)
torch.ones(1 << 20).sum()  # start the CPU thread pool before the cap: its stacks count too
with open("/proc/self/statm") as statm:
    mapped = int(statm.read().split()[0]) * resource.getpagesize()
_, hard = resource.getrlimit(resource.RLIMIT_AS)
resource.setrlimit(resource.RLIMIT_AS, (mapped + (400 << 20), hard))

model = torch.nn.Sequential(
    *[torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.ReLU()) for _ in range(6)]
)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)


@find_executable_batch_size(starting_batch_size=int(os.environ.get("START", "4096")))
def train(batch_size: int) -> int:
    for _ in range(20):
        loss = model(torch.randn(batch_size, 1024)).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return batch_size


print("trained at", train())
