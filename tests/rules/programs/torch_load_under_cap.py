"""PyTorch on the CPU, under an address-space cap 96 MiB above what the process maps once
its 192 MiB model is built: loading the model's own checkpoint back needs a second copy of
the weights, and runs out inside `torch.load`.

FIX=assign: the fix memdoc gives, under the same cap: the model is built again on the meta
device (no memory) and takes the loaded tensors as its own; one copy, and it fits.
The checkpoint goes to a temporary folder, removed at the end."""

import gc
import os
import resource
import tempfile
from pathlib import Path

import torch
from torch import nn

torch.set_num_threads(1)


def build() -> nn.Module:
    return nn.Sequential(*[nn.Linear(2048, 2048, bias=False) for _ in range(12)])


model = build()
with tempfile.TemporaryDirectory() as folder:
    path = Path(folder) / "model.pt"
    torch.save(model.state_dict(), path)
    with open("/proc/self/statm") as statm:
        mapped = int(statm.read().split()[0]) * resource.getpagesize()
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(resource.RLIMIT_AS, (mapped + (96 << 20), hard))
    assign = os.environ.get("FIX") == "assign"
    if assign:
        del model
        gc.collect()
        with torch.device("meta"):
            model = build()

    def load_checkpoint() -> None:
        state = torch.load(path, map_location="cpu", weights_only=True)
        model.load_state_dict(state, assign=assign)

    load_checkpoint()
    print("loaded")
