"""A PyTorch classifier trained for 12 steps under an address-space cap 384 MiB above what
the process maps once its data is made, then something runs out.

MODE=grad (default): after training, the program measures calibration on a held-out set
in batches of 2048, keeping each batch's probabilities, with autograd on: each kept tensor
holds its batch's graph (the 16 MiB hidden activations), and the pass runs out long after
the last training step.
MODE=next_step: the batch doubles every step (a warm-up schedule gone wrong): the step
after the last one that fitted runs out (in its backward pass), right after it."""

import os
import resource

import torch
from torch import nn

torch.manual_seed(0)
torch.backends.mkldnn.enabled = False  # the plain kernels raise the allocator's own error
model = nn.Sequential(nn.Linear(256, 2048), nn.ReLU(), nn.Linear(2048, 4))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
held_out = torch.randn(65536, 256)
with open("/proc/self/statm") as statm:
    mapped = int(statm.read().split()[0]) * resource.getpagesize()
_, hard = resource.getrlimit(resource.RLIMIT_AS)
resource.setrlimit(resource.RLIMIT_AS, (mapped + (384 << 20), hard))

mode = os.environ.get("MODE", "grad")
batch = 64
for step in range(12):
    x = torch.randn(batch, 256)
    loss = nn.functional.cross_entropy(model(x), torch.zeros(batch, dtype=torch.long))
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    if mode == "next_step":
        batch *= 2


def calibration(data: torch.Tensor) -> float:
    kept = []
    for chunk in data.split(2048):
        kept.append(model(chunk).softmax(-1))  # BUG: autograd on: each keeps its graph
    confidence = torch.cat(kept).max(-1).values
    return float(confidence.mean())


print("calibration", calibration(held_out))
