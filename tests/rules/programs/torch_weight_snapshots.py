"""PyTorch on the CPU, with a hand-made weight average that keeps a copy of the model's
8 MiB of weights after every optimizer step, under an address-space cap 400 MiB above what
the process maps once it has started: it runs out after some forty steps.

FIX=ema: memdoc's fix, under the same cap: one running average updated in place
(torch.optim.swa_utils.AveragedModel), and all 120 steps train."""

import os
import resource

import torch
from torch import nn
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

torch.set_num_threads(1)
STEPS = 120
model = nn.Sequential(nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 1024))
optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
ema = AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(0.99))
torch.ones(1 << 20).sum()
with open("/proc/self/statm") as statm:
    mapped = int(statm.read().split()[0]) * resource.getpagesize()
_, hard = resource.getrlimit(resource.RLIMIT_AS)
resource.setrlimit(resource.RLIMIT_AS, (mapped + (400 << 20), hard))
snapshots = []
for step in range(STEPS):
    batch = torch.randn(64, 1024)
    loss = model(batch).square().mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    if os.environ.get("FIX") == "ema":
        ema.update_parameters(model)
    else:
        snapshots.append({k: v.detach().clone() for k, v in model.state_dict().items()})
print("trained", STEPS, "steps")
