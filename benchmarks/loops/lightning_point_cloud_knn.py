"""Classify 3D point clouds with a DGCNN (dynamic graph CNN) in Lightning, at the paper's
batch of 32, whose training step does not fit.

Each cloud is 512 points. Every EdgeConv layer finds each point's 20 nearest neighbours
in the current features and builds an edge feature for every (point, neighbour) pair, the
point's features beside the difference to the neighbour's: a (2C, 512, 20) tensor a
cloud, 40 KiB a channel, and then a 1x1 convolution, batch normalisation and LeakyReLU on
it, before the max over the neighbours. With three EdgeConvs (64, 64 and 128 channels)
autograd keeps about 40 MiB a cloud for the backward pass, the largest tensor being the
third layer's 128-channel edge features; the weights are about 1 MiB. At 32 clouds a batch
the step's working set is about 1.3 GiB before the backward pass's own buffers, twice the
memory there is, each of its tensors a fraction of it (at most 160 MiB), and the first
training step runs out. (A batch of 4 trains under the same cap; accumulate gradients
over 8 of them for the same effective batch.)
"""

from __future__ import annotations

import math
import resource
import tempfile

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset

BUDGET_BYTES = 640 << 20  # as on a machine with 640 MiB to spare
POINTS, NEIGHBOURS, SHAPES, CLOUDS, BATCH = 512, 20, 8, 1024, 32


def cap_address_space(budget_bytes: int) -> None:
    """Allow this process `budget_bytes` more address space, so it fails in seconds."""
    with open("/proc/self/statm") as statm:
        mapped = int(statm.read().split()[0]) * resource.getpagesize()
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    soft = mapped + budget_bytes
    resource.setrlimit(resource.RLIMIT_AS, (soft if hard < 0 else min(soft, hard), hard))


class ScannedShapes(Dataset):
    """Stands in for ModelNet: noisy, randomly rotated surfaces of eight stretched shapes."""

    def __len__(self) -> int:
        return CLOUDS

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        generator = torch.Generator().manual_seed(index)
        shape = index % SHAPES
        points = torch.randn((POINTS, 3), generator=generator)
        points = points / points.norm(dim=1, keepdim=True)
        stretch = torch.tensor([1.0 + 0.3 * (shape % 4), 1.0, 1.0 + 0.5 * (shape // 4)])
        points = points * stretch + 0.02 * torch.randn((POINTS, 3), generator=generator)
        angle = float(torch.rand((), generator=generator)) * 2 * math.pi
        rotation = torch.tensor(
            [
                [math.cos(angle), -math.sin(angle), 0.0],
                [math.sin(angle), math.cos(angle), 0.0],
                [0.0, 0.0, 1.0],
            ]
        )
        return (points @ rotation.T).T.contiguous(), shape  # (3, POINTS)


def edge_features(features: torch.Tensor, neighbours: int) -> torch.Tensor:
    """(batch, C, N) -> (batch, 2C, N, k): each point beside its offset to each neighbour."""
    batch, channels, points = features.shape
    inner = -2 * features.transpose(2, 1) @ features
    squares = (features**2).sum(dim=1, keepdim=True)
    nearest = (-squares - inner - squares.transpose(2, 1)).topk(neighbours, dim=-1).indices
    nearest = nearest + torch.arange(batch)[:, None, None] * points
    flat = features.transpose(2, 1).reshape(batch * points, channels)
    around = flat[nearest.reshape(-1)].view(batch, points, neighbours, channels)
    centre = flat.view(batch, points, 1, channels).expand(-1, -1, neighbours, -1)
    return torch.cat((around - centre, centre), dim=3).permute(0, 3, 1, 2).contiguous()


class EdgeConv(nn.Module):
    def __init__(self, channels_in: int, channels_out: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(2 * channels_in, channels_out, 1, bias=False)
        self.norm = nn.BatchNorm2d(channels_out)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        edges = F.leaky_relu(self.norm(self.conv(edge_features(features, NEIGHBOURS))), 0.2)
        return edges.max(dim=-1).values


class DGCNN(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.edges = nn.ModuleList([EdgeConv(3, 64), EdgeConv(64, 64), EdgeConv(64, 128)])
        self.fuse = nn.Sequential(nn.Conv1d(256, 512, 1, bias=False), nn.BatchNorm1d(512))
        self.head = nn.Sequential(
            nn.Linear(512, 256), nn.ReLU(), nn.Dropout(0.5), nn.Linear(256, SHAPES)
        )

    def forward(self, points: torch.Tensor) -> torch.Tensor:
        features, levels = points, []
        for edge in self.edges:
            features = edge(features)
            levels.append(features)
        fused = F.leaky_relu(self.fuse(torch.cat(levels, dim=1)), 0.2)
        return self.head(fused.max(dim=-1).values)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], index: int) -> torch.Tensor:
        points, shapes = batch
        loss = F.cross_entropy(self(points), shapes)
        if index % 4 == 0:
            print(f"step {index}: loss {loss.item():.3f}", flush=True)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=1e-3)


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
        default_root_dir=tempfile.mkdtemp(prefix="lightning-point-cloud-knn-"),
    )
    loader = DataLoader(ScannedShapes(), batch_size=BATCH, shuffle=True)  # the paper's batch
    trainer.fit(DGCNN(), loader)
    print("fit finished")


if __name__ == "__main__":
    main()
