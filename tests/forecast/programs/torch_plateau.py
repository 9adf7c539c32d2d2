"""A PyTorch training loop with a cache that fills for a while, then stays full: memory grows
for FILL steps and is flat after, under an optional memory cap.

Usage: torch_plateau.py FILL STEPS [CACHE_MIB_PER_STEP] [BUDGET_MIB] [SLEEP_S]. A budget of
0 sets no cap. Ends normally after STEPS steps.
"""

from __future__ import annotations

import sys
import time

import torch
from host_cap import cap_address_space
from torch import nn

FILL = int(sys.argv[1])
STEPS = int(sys.argv[2])
CACHE_MIB = float(sys.argv[3]) if len(sys.argv) > 3 else 3.0
BUDGET_MIB = int(sys.argv[4]) if len(sys.argv) > 4 else 0
SLEEP_S = float(sys.argv[5]) if len(sys.argv) > 5 else 0.03


def main() -> None:
    torch.set_num_threads(1)
    torch.ones(1 << 20).sum()
    if BUDGET_MIB:
        cap_address_space(BUDGET_MIB << 20)
    model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 10))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    cache: dict[int, torch.Tensor] = {}
    for step in range(1, STEPS + 1):
        batch = torch.randn(64, 256)
        loss = model(batch).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        key = step % FILL  # FILL distinct keys: full after FILL steps, then replaced in place
        cache[key] = torch.full((int(CACHE_MIB * (1 << 20)) // 4,), float(step))
        print(f"step {step}", flush=True)
        time.sleep(SLEEP_S)
    print("done", flush=True)


if __name__ == "__main__":
    main()
