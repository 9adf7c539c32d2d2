"""Train a classifier with Lightning, validating every epoch: a run with no memory problem.

Training steps with a modest batch, Lightning's own validation loop (autograd off) after
each epoch, metrics logged as numbers. Memory rises while the first steps allocate the
optimizer state and the batches, then goes up and down with the phases without growing;
the fit finishes.
"""

from __future__ import annotations

import resource
import tempfile

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

BUDGET_BYTES = 640 << 20  # as on a machine with 640 MiB to spare
FEATURES, HIDDEN, CLASSES = 256, 512, 10
TRAIN_ROWS, VAL_ROWS, BATCH = 6144, 2048, 128


def cap_address_space(budget_bytes: int) -> None:
    """Allow this process `budget_bytes` more address space, so it fails in seconds."""
    with open("/proc/self/statm") as statm:
        mapped = int(statm.read().split()[0]) * resource.getpagesize()
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    soft = mapped + budget_bytes
    resource.setrlimit(resource.RLIMIT_AS, (soft if hard < 0 else min(soft, hard), hard))


def make_rows(count: int, seed: int) -> TensorDataset:
    generator = torch.Generator().manual_seed(seed)
    labels = torch.randint(CLASSES, (count,), generator=generator)
    features = torch.randn(count, FEATURES, generator=generator)
    features[:, :CLASSES] += 2 * F.one_hot(labels, CLASSES)
    return TensorDataset(features, labels)


class Classifier(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(FEATURES, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, HIDDEN), nn.ReLU(),
            nn.Linear(HIDDEN, CLASSES),
        )  # fmt: skip

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], index: int) -> torch.Tensor:
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], index: int) -> None:
        x, y = batch
        logits = self(x)
        self.log("val_loss", F.cross_entropy(logits, y))
        self.log("val_accuracy", (logits.argmax(-1) == y).float().mean())

    def on_validation_epoch_end(self) -> None:
        metrics = self.trainer.callback_metrics
        print(f"epoch {self.current_epoch}: val accuracy {metrics['val_accuracy']:.3f}")

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


def main() -> None:
    pl.seed_everything(0)
    torch.ones(1 << 20).sum()  # start the thread pool before the cap: its stacks count
    cap_address_space(BUDGET_BYTES)
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        max_epochs=3,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tempfile.mkdtemp(prefix="lightning-validation-control-"),
    )
    trainer.fit(
        Classifier(),
        DataLoader(make_rows(TRAIN_ROWS, seed=0), batch_size=BATCH, shuffle=True),
        DataLoader(make_rows(VAL_ROWS, seed=1), batch_size=BATCH),
    )


if __name__ == "__main__":
    main()
