"""Train a 4x super-resolution network for fluorescence microscopy with Lightning, a VDSR
that runs all its convolutions at the output resolution, at a batch whose feature maps do
not fit.

Each example is a 128 x 128 crop of a high-resolution image of labelled puncta and its
32 x 32 low-resolution version; VDSR first upsamples the low-resolution crop back to
128 x 128 (bicubic) and then refines it with 20 convolutions of 64 channels at that full
resolution, learning the residual. The weights are small (about 0.67 million, 2.6 MiB),
but every layer's 64 x 128 x 128 feature map is 4 MiB an image, and autograd keeps one
a layer for the backward pass (the ReLU's output, which is the next convolution's input):
at a batch of 16 that is 64 MiB a layer, 1.25 GiB for the 20 layers, with another 64 MiB
map in flight. Against 1 GiB of memory the first training step runs out in its forward
pass, a dozen or so layers in, though the weights and Adam's state take under 10 MiB. (A
batch of 2, 160 MiB of kept feature maps, trains under the same cap; so would running the
convolutions at the low resolution and upsampling at the end, as ESPCN and EDSR do, 16
times less.)
"""

from __future__ import annotations

import resource
import tempfile

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset

BUDGET_BYTES = 1024 << 20  # as on a machine with 1 GiB to spare
HIGH, SCALE, LAYERS, WIDTH, BATCH, CROPS, PUNCTA = 128, 4, 20, 64, 16, 512, 40


def cap_address_space(budget_bytes: int) -> None:
    """Allow this process `budget_bytes` more address space, so it fails in seconds."""
    with open("/proc/self/statm") as statm:
        mapped = int(statm.read().split()[0]) * resource.getpagesize()
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    soft = mapped + budget_bytes
    resource.setrlimit(resource.RLIMIT_AS, (soft if hard < 0 else min(soft, hard), hard))


class Puncta(Dataset):
    """Stands in for paired acquisitions: Gaussian spots at random places, imaged at full
    resolution and binned 4 x 4 with camera noise."""

    def __init__(self) -> None:
        axis = torch.arange(HIGH, dtype=torch.float32)
        self.grid = torch.stack(torch.meshgrid(axis, axis, indexing="ij"))

    def __len__(self) -> int:
        return CROPS

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        generator = torch.Generator().manual_seed(index)
        centres = torch.rand((PUNCTA, 2, 1, 1), generator=generator) * HIGH
        widths = 1.0 + 2.0 * torch.rand((PUNCTA, 1, 1), generator=generator)
        distance = ((self.grid - centres) ** 2).sum(dim=1)
        high = torch.exp(-distance / (2 * widths**2)).sum(dim=0, keepdim=True)
        low = F.avg_pool2d(high[None], SCALE)[0]
        low = low + 0.02 * torch.randn(low.shape, generator=generator)
        return low, high


class VDSR(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        layers: list[nn.Module] = [nn.Conv2d(1, WIDTH, 3, padding=1), nn.ReLU()]
        for _ in range(LAYERS - 2):
            layers += [nn.Conv2d(WIDTH, WIDTH, 3, padding=1), nn.ReLU()]
        layers.append(nn.Conv2d(WIDTH, 1, 3, padding=1))
        self.body = nn.Sequential(*layers)

    def forward(self, low: torch.Tensor) -> torch.Tensor:
        upsampled = F.interpolate(low, scale_factor=SCALE, mode="bicubic", align_corners=False)
        return upsampled + self.body(upsampled)  # every convolution at 128 x 128

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], index: int) -> torch.Tensor:
        low, high = batch
        loss = F.l1_loss(self(low), high)
        if index % 4 == 0:
            print(f"step {index}: L1 {loss.item():.4f}", flush=True)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=1e-4)


def main() -> None:
    pl.seed_everything(0)
    torch.ones(1 << 20).sum()  # start the thread pool before the cap: its stacks count
    # oneDNN reports a failed allocation as "could not create a primitive"; the plain kernels
    # raise the allocator's own error, as on a GPU.
    torch.backends.mkldnn.enabled = False
    cap_address_space(BUDGET_BYTES)
    model = VDSR()
    weights = sum(p.numel() for p in model.parameters())
    print(f"VDSR: {weights / 1e6:.2f}M weights, batch {BATCH} of {HIGH} x {HIGH}", flush=True)
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        max_epochs=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tempfile.mkdtemp(prefix="lightning-vdsr-"),
    )
    trainer.fit(model, DataLoader(Puncta(), batch_size=BATCH, shuffle=True))
    print("fit finished")


if __name__ == "__main__":
    main()
