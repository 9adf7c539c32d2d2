"""Lightning on CPU: validation keeps every batch's logits (1 MiB) for a metric and never
clears them, under an address-space cap 500 MiB above what the process maps at start.

With CLEAR=1 in the environment it clears them at the end of each validation epoch and
trains 12 epochs to the end: the near miss."""

import os
import resource

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader, TensorDataset


class M(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 512)
        )
        self.kept = []

    def training_step(self, batch, i):
        x, y = batch
        return torch.nn.functional.cross_entropy(self.net(x), y)

    def validation_step(self, batch, i):
        x, y = batch
        logits = self.net(x).repeat(1, 8)  # 64 x 4096 floats = 1 MiB a batch
        self.kept.append(logits)  # kept for an epoch-end metric, never cleared

    def on_validation_epoch_end(self):
        if os.environ.get("CLEAR") == "1":
            self.kept.clear()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


torch.ones(1 << 20).sum()
with open("/proc/self/statm") as f:
    mapped = int(f.read().split()[0]) * resource.getpagesize()
resource.setrlimit(
    resource.RLIMIT_AS, (mapped + (500 << 20), resource.getrlimit(resource.RLIMIT_AS)[1])
)
data = TensorDataset(torch.randn(1280, 64), torch.randint(0, 512, (1280,)))
trainer = pl.Trainer(
    max_epochs=12 if os.environ.get("CLEAR") == "1" else 40,
    logger=False,
    enable_checkpointing=False,
    enable_progress_bar=False,
    enable_model_summary=False,
    accelerator="cpu",
    num_sanity_val_steps=0,
)
trainer.fit(M(), DataLoader(data, batch_size=64), DataLoader(data, batch_size=64))
