"""A PyTorch loop under an address-space cap 384 MiB above what the process maps once its
data is made, whose memory grows every step until it runs out.

MODE=carried (default): a running mean of the hidden features is carried from step to step
with its graph; the second backward raised "Trying to backward through the graph a second
time", so `retain_graph=True` was added: no step's graph is ever freed, and each keeps its
batch (32 MiB, saved for the first layer's gradient); the run runs out making a fresh batch,
outside any backward call.
MODE=two_losses: two losses on one forward pass, the first backward with
`retain_graph=True`, the second freeing the graph as it should; the memory grows because
the loop keeps each step's batch for a later look at the hardest ones (32 MiB a step)."""

import os
import resource

import torch
from torch import nn

torch.manual_seed(0)
torch.backends.mkldnn.enabled = False  # the plain kernels raise the allocator's own error
model = nn.Sequential(nn.Linear(2048, 64), nn.ReLU(), nn.Linear(64, 10))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
with open("/proc/self/statm") as statm:
    mapped = int(statm.read().split()[0]) * resource.getpagesize()
_, hard = resource.getrlimit(resource.RLIMIT_AS)
resource.setrlimit(resource.RLIMIT_AS, (mapped + (384 << 20), hard))

mode = os.environ.get("MODE", "carried")
centre = torch.zeros(64)
kept = []
for step in range(200):
    x = torch.randn(4096, 2048)  # a fresh 32 MiB batch: where the run runs out
    hidden = model[1](model[0](x))
    if mode == "carried":
        centre = 0.9 * centre + 0.1 * hidden.mean(dim=0)  # BUG: carries every step's graph
        loss = model[2](hidden - centre).square().mean()
        loss.backward(retain_graph=True)
    else:
        out = model[2](hidden)
        out.square().mean().backward(retain_graph=True)
        out.abs().mean().backward()  # frees the graph
        kept.append(x)  # BUG: every batch kept, never dropped
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
print("finished")
