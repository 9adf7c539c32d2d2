"""A PyTorch loop fed by a DataLoader with two worker processes, for 40 steps.

CACHE=1: the dataset memoizes each item it makes (1 MiB), so each worker fills its own copy
of the cache by 4 MiB a batch while the process that trains stays flat.
LEAK=1: the workers cache nothing; the training loop keeps half of each batch (4 MiB) it
was handed, never released."""

import os
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

CACHE = os.environ.get("CACHE") == "1"
LEAK = os.environ.get("LEAK") == "1"


class Scans(Dataset):
    def __init__(self) -> None:
        self.cache: dict[int, torch.Tensor] = {}

    def __len__(self) -> int:
        return 40 * 8

    def __getitem__(self, index: int) -> torch.Tensor:
        if index in self.cache:
            return self.cache[index]
        item = torch.full((1 << 18,), float(index))  # 1 MiB
        if CACHE:
            self.cache[index] = item
        return item


def main() -> None:
    torch.set_num_threads(1)
    model = nn.Linear(64, 4)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    kept = []
    loader = DataLoader(Scans(), batch_size=8, num_workers=2, persistent_workers=True)
    for batch in loader:
        loss = model(batch.view(len(batch), -1, 64).mean(1)).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if LEAK:
            kept.append(batch[:4].clone())  # 4 MiB a step, never released
        time.sleep(0.05)
    print("done", len(kept))


if __name__ == "__main__":
    main()
