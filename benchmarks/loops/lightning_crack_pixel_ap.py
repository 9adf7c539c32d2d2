"""Train a small crack-segmentation net with Lightning, logging the per-pixel average
precision of the training epoch with torchmetrics.

`BinaryAveragePrecision()` is created with its default `thresholds=None`, the exact
curve: it cannot summarise a batch, so each `update` appends the batch's predictions and
targets to its list states, to be concatenated and sorted by `compute` at the epoch's
end (`self.log(..., on_epoch=True)`). For a batch of 16 tiles of 256 x 256 pixels that is
a million probabilities (4 MiB) and a million int64 targets (8 MiB) kept every step, for
the whole epoch. The net itself (three strided convolutions and an upsampling head) needs
a few dozen MiB a step, so memory grows by 12 MiB a step and the fit runs out in its
first epoch, after about thirty of its 64 steps. (With `thresholds=200` the metric keeps
a fixed 200 x 2 x 2 confusion count instead, and the fit trains under the same cap.)
"""

from __future__ import annotations

import resource
import tempfile

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset
from torchmetrics.classification import BinaryAveragePrecision

BUDGET_BYTES = 448 << 20  # as on a machine with 448 MiB to spare
SIDE, TILES, BATCH = 256, 1024, 16


def cap_address_space(budget_bytes: int) -> None:
    """Allow this process `budget_bytes` more address space, so it fails in seconds."""
    with open("/proc/self/statm") as statm:
        mapped = int(statm.read().split()[0]) * resource.getpagesize()
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    soft = mapped + budget_bytes
    resource.setrlimit(resource.RLIMIT_AS, (soft if hard < 0 else min(soft, hard), hard))


class RoadTiles(Dataset):
    """Stands in for photos of road surface: dark thin cracks, horizontal or vertical."""

    def __len__(self) -> int:
        return TILES

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        generator = torch.Generator().manual_seed(index)
        image = 0.6 + 0.1 * torch.randn((3, SIDE, SIDE), generator=generator)
        mask = torch.zeros((1, SIDE, SIDE), dtype=torch.long)
        for _ in range(int(torch.randint(1, 5, (), generator=generator))):
            start = int(torch.randint(0, SIDE - 3, (), generator=generator))
            width = int(torch.randint(1, 4, (), generator=generator))
            if torch.rand((), generator=generator) < 0.5:
                mask[:, start : start + width, :] = 1
            else:
                mask[:, :, start : start + width] = 1
        image = image - 0.4 * mask
        return image, mask


class CrackSegmenter(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Sequential(
            nn.Conv2d(3, 8, 3, stride=2, padding=1),
            nn.ReLU(),
            nn.Conv2d(8, 16, 3, stride=2, padding=1),
            nn.ReLU(),
            nn.Conv2d(16, 32, 3, stride=2, padding=1),
            nn.ReLU(),
        )
        self.head = nn.Conv2d(32, 1, 1)
        self.train_ap = BinaryAveragePrecision()  # BUG: exact curve, keeps every pixel

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        coarse = self.head(self.encoder(images))
        return F.interpolate(coarse, size=images.shape[-2:], mode="bilinear")

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], index: int) -> torch.Tensor:
        images, masks = batch
        logits = self(images)
        loss = F.binary_cross_entropy_with_logits(logits, masks.float())
        self.train_ap.update(logits, masks)
        self.log("train_ap", self.train_ap, on_step=False, on_epoch=True)
        if index % 8 == 0:
            print(f"step {index}: loss {loss.item():.3f}", flush=True)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=3e-3)


def main() -> None:
    pl.seed_everything(0)
    torch.ones(1 << 20).sum()  # start the thread pool before the cap: its stacks count
    # oneDNN reports a failed allocation as "could not create a primitive"; the plain kernels
    # raise the allocator's own error, as on a GPU.
    torch.backends.mkldnn.enabled = False
    cap_address_space(BUDGET_BYTES)
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        max_epochs=2,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tempfile.mkdtemp(prefix="lightning-crack-pixel-ap-"),
    )
    loader = DataLoader(RoadTiles(), batch_size=BATCH, shuffle=True)
    trainer.fit(CrackSegmenter(), loader)
    print("fit finished")


if __name__ == "__main__":
    main()
