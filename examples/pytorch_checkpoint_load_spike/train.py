"""Resume a fine-tuning job with `torch.load(path)` and no `map_location`.

The bug: the checkpoint was saved from GPU tensors, so `torch.load` puts every tensor back on
the GPU it came from, next to the model that is already there: for a moment the weights exist
twice. The job caches its training set on the GPU (as small-data jobs often do) and trains
only a small head on a frozen backbone, so it fits with its weights once, not twice.

GPU only: on a CPU, `torch.load` always loads into host memory.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

WIDTH = 4096
BATCH_SIZE = 256
CLASSES = 10


def build_model(depth: int) -> nn.Module:
    """A frozen pretrained backbone and a small trainable head."""
    backbone = nn.Sequential(*(nn.Linear(WIDTH, WIDTH) for _ in range(depth)))
    backbone.requires_grad_(False)
    return nn.Sequential(backbone, nn.Linear(WIDTH, CLASSES))


def fine_tune(model: nn.Module, train_set: torch.Tensor, steps: int) -> None:
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    for step in range(steps):
        batch = train_set[step * BATCH_SIZE : (step + 1) * BATCH_SIZE].float()
        targets = torch.randint(CLASSES, (len(batch),), device=batch.device)
        loss = F.cross_entropy(model(batch), targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        print(f"step {step}: loss {loss.item():.3f}", flush=True)


def main() -> None:
    if not torch.cuda.is_available():
        sys.exit("this example needs a CUDA GPU: on a CPU, torch.load loads into host memory")
    device = torch.device("cuda")
    total_bytes = torch.cuda.get_device_properties(device).total_memory
    # The weights take 8% of the GPU and the cached training set 88%: the job fits with the
    # weights once (96%), not twice (104%).
    depth = int(0.08 * total_bytes) // (WIDTH * WIDTH * 4)
    dataset_rows = int(0.88 * total_bytes) // WIDTH
    folder = Path(tempfile.mkdtemp())
    checkpoint = folder / "last.pt"
    try:
        # Yesterday's run saved this checkpoint from the GPU, tensors with their device.
        with torch.device(device):
            torch.save(build_model(depth).state_dict(), checkpoint)
        torch.cuda.empty_cache()
        print(f"checkpoint: {checkpoint.stat().st_size / 2**30:.1f} GiB", flush=True)

        # Today the job restarts: the model, the cached training set, then the checkpoint.
        with torch.device(device):
            model = build_model(depth)
            train_set = torch.randint(0, 256, (dataset_rows, WIDTH), dtype=torch.uint8)
        state = torch.load(checkpoint)  # BUG: back onto the GPU, next to the model
        model.load_state_dict(state)
        del state
        fine_tune(model, train_set, steps=10)
    finally:
        shutil.rmtree(folder)


if __name__ == "__main__":
    main()
