"""Let Lightning's `Tuner.scale_batch_size` pick the batch, then fit.

The tuner doubles the batch from 512 and runs a few steps at each size; the working set of
a step grows with the batch until one size runs out of memory in its forward or backward
pass. The tuner catches that error, keeps the last size that fit, and the fit finishes.
"""

from __future__ import annotations

import resource
import tempfile

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from lightning.pytorch.tuner import Tuner
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

BUDGET_BYTES = 720 << 20  # as on a machine with 720 MiB to spare
VOCAB, SEQ, HIDDEN, CLASSES, SEQUENCES = 1000, 64, 64, 8, 16384


def cap_address_space(budget_bytes: int) -> None:
    """Allow this process `budget_bytes` more address space, so it fails in seconds."""
    with open("/proc/self/statm") as statm:
        mapped = int(statm.read().split()[0]) * resource.getpagesize()
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    soft = mapped + budget_bytes
    resource.setrlimit(resource.RLIMIT_AS, (soft if hard < 0 else min(soft, hard), hard))


class Tagger(pl.LightningModule):
    def __init__(self, batch_size: int = 128) -> None:
        super().__init__()
        self.batch_size = batch_size
        self.embed = nn.Embedding(VOCAB, HIDDEN)
        self.body = nn.Sequential(
            nn.Linear(HIDDEN, 4 * HIDDEN), nn.GELU(), nn.Linear(4 * HIDDEN, HIDDEN), nn.GELU()
        )
        self.head = nn.Linear(HIDDEN, CLASSES)
        generator = torch.Generator().manual_seed(0)
        tokens = torch.randint(VOCAB, (SEQUENCES, SEQ), generator=generator)
        labels = torch.randint(CLASSES, (SEQUENCES, SEQ), generator=generator)
        self.data = TensorDataset(tokens, labels)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(self.embed(tokens)))

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], index: int) -> torch.Tensor:
        tokens, labels = batch
        return F.cross_entropy(self(tokens).flatten(0, 1), labels.flatten())

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=1e-3)

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.data, batch_size=self.batch_size, shuffle=True)


def main() -> None:
    pl.seed_everything(0)
    model = Tagger()
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=3,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tempfile.mkdtemp(prefix="lightning-tuner-"),
    )
    torch.ones(1 << 20).sum()  # start the thread pool before the cap: its stacks count
    # oneDNN reports a failed allocation as "could not create a primitive"; the plain kernels
    # raise the allocator's own error, as on a GPU.
    torch.backends.mkldnn.enabled = False
    cap_address_space(BUDGET_BYTES)
    found = Tuner(trainer).scale_batch_size(
        model, mode="power", init_val=512, steps_per_trial=2, max_trials=6
    )
    print(f"tuner chose batch size {found}", flush=True)
    trainer.fit(model)
    print("fit finished")


if __name__ == "__main__":
    main()
