"""PyTorch on the CPU reads its dataset through a memory map, a new 4 MiB slice each step,
and keeps nothing: the file's pages it has read stay resident in the process (its RSS
grows 4 MiB a step) but they are the page cache's, not the program's.

LEAK=1: the same loop also keeps each step's 3 MiB output (a real leak) beside the reads.
The dataset goes to a temporary file, removed at the end."""

import os
import tempfile
import time

import numpy as np
import torch
from torch import nn

import memdoc

torch.set_num_threads(1)
STEPS, ROWS, WIDTH = 50, 1024, 1024  # 4 MiB of float32 a step
leak = os.environ.get("LEAK") == "1"
model = nn.Linear(WIDTH, 16)
optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
kept = []
with tempfile.NamedTemporaryFile(suffix=".f32") as file:
    np.ones((STEPS * ROWS, WIDTH), dtype=np.float32).tofile(file.name)
    data = np.memmap(file.name, dtype=np.float32, mode="r", shape=(STEPS * ROWS, WIDTH))
    for step in range(STEPS):
        batch = torch.from_numpy(np.asarray(data[step * ROWS : (step + 1) * ROWS]))
        loss = model(batch).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if leak:
            kept.append(torch.full((3 << 18,), float(step)))
        time.sleep(0.03)
    del data
print("done", memdoc.__name__)
