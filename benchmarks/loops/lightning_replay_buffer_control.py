"""Train an image classifier with Lightning on a stream of tasks that arrive one after
another (class-incremental learning), rehearsing old tasks from a bounded replay buffer: a
run with no memory problem, whose memory climbs through the first quarter of the fit.

The stream has five tasks of two new classes each, 48 batches of 64 images (3 x 64 x 64
floats, 48 KiB each) a task, in order. To keep from forgetting earlier tasks, every
training step mixes 64 images drawn from a replay buffer into the batch, and then offers
the batch's own images to the buffer by reservoir sampling, which keeps a uniform sample
of everything seen so far in at most 4096 images. Until the buffer is full every image is
kept, a copy (`image.clone()`) of 48 KiB: memory rises step after step, by 3 MiB of
buffer a step and more with the allocator's overheads, for the first 64 steps, as a leak
would, to 192 MiB of buffer; from then on each kept image replaces one,
the buffer stays at 4096, and memory stays flat for the remaining 176 steps. It all fits
with room to spare and the fit finishes.
"""

from __future__ import annotations

import ctypes
import random
import resource
import tempfile

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset

BUDGET_BYTES = 640 << 20  # as on a machine with 640 MiB to spare
SIDE, TASKS, CLASSES_PER_TASK, BATCHES_PER_TASK, BATCH, CAPACITY = 64, 5, 2, 48, 64, 4096


def cap_address_space(budget_bytes: int) -> None:
    """Allow this process `budget_bytes` more address space, so it fails in seconds."""
    with open("/proc/self/statm") as statm:
        mapped = int(statm.read().split()[0]) * resource.getpagesize()
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    soft = mapped + budget_bytes
    resource.setrlimit(resource.RLIMIT_AS, (soft if hard < 0 else min(soft, hard), hard))


class TaskStream(Dataset):
    """Stands in for a split image benchmark: task t brings classes 2t and 2t + 1, each a
    blob of its own colour at its own place, in noise."""

    def __len__(self) -> int:
        return TASKS * BATCHES_PER_TASK * BATCH

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        generator = torch.Generator().manual_seed(index)
        task = index // (BATCHES_PER_TASK * BATCH)
        label = CLASSES_PER_TASK * task + int(
            torch.randint(CLASSES_PER_TASK, (), generator=generator)
        )
        image = 0.2 * torch.randn((3, SIDE, SIDE), generator=generator)
        row, column = 8 + 4 * label, 56 - 4 * label
        image[label % 3, row - 6 : row + 6, column - 6 : column + 6] += 1.0
        return image, label


class ReservoirBuffer:
    """A uniform sample of every example offered so far, of at most `capacity` examples."""

    def __init__(self, capacity: int) -> None:
        self.capacity, self.offered = capacity, 0
        self.images: list[torch.Tensor] = []
        self.labels: list[int] = []

    def offer(self, images: torch.Tensor, labels: torch.Tensor) -> None:
        for image, label in zip(images, labels.tolist(), strict=True):
            self.offered += 1
            if len(self.images) < self.capacity:
                self.images.append(image.clone())
                self.labels.append(label)
            else:
                slot = random.randrange(self.offered)
                if slot < self.capacity:
                    self.images[slot], self.labels[slot] = image.clone(), label

    def sample(self, count: int) -> tuple[torch.Tensor, torch.Tensor]:
        chosen = random.sample(range(len(self.images)), min(count, len(self.images)))
        images = torch.stack([self.images[i] for i in chosen])
        return images, torch.tensor([self.labels[i] for i in chosen])


class RehearsalClassifier(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv2d(3, 16, 3, stride=2, padding=1),
            nn.ReLU(),
            nn.Conv2d(16, 32, 3, stride=2, padding=1),
            nn.ReLU(),
            nn.Conv2d(32, 64, 3, stride=2, padding=1),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
            nn.Linear(64, TASKS * CLASSES_PER_TASK),
        )
        self.replay = ReservoirBuffer(CAPACITY)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], index: int) -> torch.Tensor:
        images, labels = batch
        if self.replay.images:
            old_images, old_labels = self.replay.sample(BATCH)
            images, labels = torch.cat((images, old_images)), torch.cat((labels, old_labels))
        loss = F.cross_entropy(self.net(images), labels)
        self.replay.offer(*batch)
        if index % 16 == 0:
            print(
                f"step {index}: loss {loss.item():.3f}, {len(self.replay.images)} kept", flush=True
            )
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=1e-3)


def main() -> None:
    # Allocations of 128 KiB and more get their own mappings, returned when freed, as a
    # device's caching allocator keeps large blocks apart from small ones: otherwise the
    # kept images, scattered over glibc's heap, pin the freed batches around them.
    ctypes.CDLL("libc.so.6").mallopt(-3, 128 << 10)  # M_MMAP_THRESHOLD
    pl.seed_everything(0)
    torch.ones(1 << 20).sum()  # start the thread pool before the cap: its stacks count
    # oneDNN reports a failed allocation as "could not create a primitive"; the plain kernels
    # raise the allocator's own error, as on a GPU.
    torch.backends.mkldnn.enabled = False
    cap_address_space(BUDGET_BYTES)
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        max_epochs=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tempfile.mkdtemp(prefix="lightning-replay-buffer-"),
    )
    stream = DataLoader(TaskStream(), batch_size=BATCH, shuffle=False)  # tasks in order
    trainer.fit(RehearsalClassifier(), stream)
    print("fit finished")


if __name__ == "__main__":
    main()
