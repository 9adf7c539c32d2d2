"""Train a vibration autoencoder for pump anomaly detection with Lightning, validating on a
large held-out set every 8 steps and keeping the worst-reconstructed windows for a report:
a run with no memory problem, whose memory jumps at every validation.

Each window is half a second of a 3-axis accelerometer at 2 kHz (3 x 1024 floats, 12 KiB).
The autoencoder is a 1D conv encoder and decoder of 32 channels with two strided stages;
a training step on 64 windows needs a few dozen MiB, for 32 steps. Every 8 training steps
(`val_check_interval=8`) Lightning validates on 2048 held-out windows in batches of 1024
(under inference mode): each batch's feature maps are 128 MiB at full resolution, so
memory jumps by a few hundred MiB during each validation and falls back after it. The
validation also keeps a report of the 32 worst-reconstructed windows, cloned, replacing
better ones as worse ones turn up: at most 384 KiB, filled at the first validation. Nothing
grows from one validation to the next, it all fits within the cap, and the fit finishes.
"""

from __future__ import annotations

import ctypes
import resource
import tempfile

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

BUDGET_BYTES = 1024 << 20  # as on a machine with 1 GiB to spare
AXES, SAMPLES, WIDTH, BATCH, VAL_BATCH, WORST = 3, 1024, 32, 64, 1024, 32
TRAIN, HELD_OUT, EVERY = 2048, 2048, 8


def cap_address_space(budget_bytes: int) -> None:
    """Allow this process `budget_bytes` more address space, so it fails in seconds."""
    with open("/proc/self/statm") as statm:
        mapped = int(statm.read().split()[0]) * resource.getpagesize()
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    soft = mapped + budget_bytes
    resource.setrlimit(resource.RLIMIT_AS, (soft if hard < 0 else min(soft, hard), hard))


def make_windows(count: int, generator: torch.Generator, faulty: float) -> torch.Tensor:
    """Stands in for pump vibration: a running frequency with harmonics, and for a share of
    the windows a bearing fault's periodic impacts."""
    time = torch.arange(SAMPLES) / 2000.0
    speed = 25 + 5 * torch.rand((count, 1, 1), generator=generator)
    axis_gain = torch.tensor([1.0, 0.6, 0.3])[None, :, None]
    windows = axis_gain * (
        torch.sin(2 * torch.pi * speed * time) + 0.3 * torch.sin(4 * torch.pi * speed * time)
    )
    impacts = (torch.sin(2 * torch.pi * 7.3 * speed * time) > 0.98).float()
    broken = (torch.rand((count, 1, 1), generator=generator) < faulty).float()
    noise = 0.05 * torch.randn((count, AXES, SAMPLES), generator=generator)
    return windows + broken * impacts + noise


class VibrationAutoencoder(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Sequential(
            nn.Conv1d(AXES, WIDTH, 7, padding=3),
            nn.ReLU(),
            nn.Conv1d(WIDTH, WIDTH, 7, stride=4, padding=3),
            nn.ReLU(),
            nn.Conv1d(WIDTH, WIDTH, 7, stride=4, padding=3),
        )
        self.decoder = nn.Sequential(
            nn.ConvTranspose1d(WIDTH, WIDTH, 4, stride=4),
            nn.ReLU(),
            nn.ConvTranspose1d(WIDTH, WIDTH, 4, stride=4),
            nn.ReLU(),
            nn.Conv1d(WIDTH, AXES, 7, padding=3),
        )
        self.worst: list[tuple[float, torch.Tensor]] = []  # the report, at most WORST windows

    def forward(self, windows: torch.Tensor) -> torch.Tensor:
        return self.decoder(self.encoder(windows))

    def training_step(self, batch: list[torch.Tensor], index: int) -> torch.Tensor:
        (windows,) = batch
        loss = F.mse_loss(self(windows), windows)
        if index % 8 == 0:
            print(f"step {index}: loss {loss.item():.4f}", flush=True)
        return loss

    def validation_step(self, batch: list[torch.Tensor], index: int) -> None:
        (windows,) = batch
        errors = (self(windows) - windows).square().mean(dim=(1, 2))
        self.log("val_error", errors.mean(), prog_bar=False)
        for error, position in zip(*errors.topk(WORST), strict=True):
            if len(self.worst) < WORST or error > self.worst[-1][0]:
                self.worst.append((float(error), windows[position].clone()))
                self.worst.sort(key=lambda item: -item[0])
                del self.worst[WORST:]

    def on_validation_epoch_end(self) -> None:
        print(f"validation: worst window error {self.worst[0][0]:.4f}", flush=True)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=1e-3)


def main() -> None:
    # Allocations of 128 KiB and more get their own mappings, returned when freed, as a
    # device's caching allocator keeps large blocks apart from small ones: otherwise the
    # kept windows, scattered over glibc's heap, pin the freed batches around them.
    ctypes.CDLL("libc.so.6").mallopt(-3, 128 << 10)  # M_MMAP_THRESHOLD
    pl.seed_everything(0)
    torch.ones(1 << 20).sum()  # start the thread pool before the cap: its stacks count
    # oneDNN reports a failed allocation as "could not create a primitive"; the plain kernels
    # raise the allocator's own error, as on a GPU.
    torch.backends.mkldnn.enabled = False
    cap_address_space(BUDGET_BYTES)
    generator = torch.Generator().manual_seed(0)
    train = DataLoader(
        TensorDataset(make_windows(TRAIN, generator, faulty=0.0)), batch_size=BATCH, shuffle=True
    )
    held_out = DataLoader(
        TensorDataset(make_windows(HELD_OUT, generator, faulty=0.05)), batch_size=VAL_BATCH
    )
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        max_epochs=1,
        val_check_interval=EVERY,
        num_sanity_val_steps=0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tempfile.mkdtemp(prefix="lightning-vibration-"),
    )
    trainer.fit(VibrationAutoencoder(), train, held_out)
    print("fit finished")


if __name__ == "__main__":
    main()
