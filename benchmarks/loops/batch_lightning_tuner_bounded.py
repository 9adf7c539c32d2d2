"""Let Lightning's `Tuner.scale_batch_size` pick the batch of a tabular churn model within a
bounded search, then fit: a run with no memory problem.

The tuner doubles the batch from 32 and runs three steps at each size, for at most six
trials, so the largest batch it tries is 1024. Each trial's working set is larger than the
last, so memory steps up from trial to trial, but even the largest batch needs well under
half the memory there is: no trial runs out, the tuner keeps 1024, and the fit at that size
(AdamW, a validation pass each epoch) stays flat and finishes.
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

BUDGET_BYTES = 512 << 20  # as on a machine with 512 MiB to spare
FEATURES, HIDDEN, CUSTOMERS, HELD_OUT = 128, 1024, 16384, 4096


def cap_address_space(budget_bytes: int) -> None:
    """Allow this process `budget_bytes` more address space, so it fails in seconds."""
    with open("/proc/self/statm") as statm:
        mapped = int(statm.read().split()[0]) * resource.getpagesize()
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    soft = mapped + budget_bytes
    resource.setrlimit(resource.RLIMIT_AS, (soft if hard < 0 else min(soft, hard), hard))


def make_customers(count: int, seed: int) -> TensorDataset:
    """Stands in for customer records: churn depends on a few of the features."""
    generator = torch.Generator().manual_seed(seed)
    features = torch.randn(count, FEATURES, generator=generator)
    score = features[:, 0] - 0.8 * features[:, 1] + 0.5 * features[:, 2] * features[:, 3]
    churned = (torch.sigmoid(2 * score) > torch.rand(count, generator=generator)).float()
    return TensorDataset(features, churned)


class ChurnModel(pl.LightningModule):
    def __init__(self, batch_size: int = 32) -> None:
        super().__init__()
        self.batch_size = batch_size
        self.net = nn.Sequential(
            nn.Linear(FEATURES, HIDDEN), nn.GELU(), nn.Linear(HIDDEN, HIDDEN), nn.GELU(),
            nn.Linear(HIDDEN, HIDDEN), nn.GELU(), nn.Linear(HIDDEN, 1),
        )  # fmt: skip
        self.train_rows = make_customers(CUSTOMERS, seed=0)
        self.val_rows = make_customers(HELD_OUT, seed=1)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.net(features).squeeze(-1)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], index: int) -> torch.Tensor:
        features, churned = batch
        loss = F.binary_cross_entropy_with_logits(self(features), churned)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], index: int) -> None:
        features, churned = batch
        logits = self(features)
        self.log("val_loss", F.binary_cross_entropy_with_logits(logits, churned))
        self.log("val_accuracy", ((logits > 0).float() == churned).float().mean())

    def on_validation_epoch_end(self) -> None:
        if not self.trainer.sanity_checking:
            accuracy = self.trainer.callback_metrics["val_accuracy"]
            print(f"epoch {self.current_epoch}: val accuracy {accuracy:.3f}", flush=True)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=1e-3)

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.train_rows, batch_size=self.batch_size, shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val_rows, batch_size=self.batch_size)


def main() -> None:
    pl.seed_everything(0)
    model = ChurnModel()
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        max_epochs=3,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tempfile.mkdtemp(prefix="lightning-tuner-bounded-"),
    )
    torch.ones(1 << 20).sum()  # start the thread pool before the cap: its stacks count
    # oneDNN reports a failed allocation as "could not create a primitive"; the plain kernels
    # raise the allocator's own error, as on a GPU.
    torch.backends.mkldnn.enabled = False
    cap_address_space(BUDGET_BYTES)
    found = Tuner(trainer).scale_batch_size(
        model, mode="power", init_val=32, steps_per_trial=3, max_trials=6
    )
    print(f"tuner chose batch size {found}", flush=True)
    trainer.fit(model)
    print("fit finished")


if __name__ == "__main__":
    main()
