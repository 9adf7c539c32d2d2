"""Train a small language model with Lightning, gathering step outputs for epoch metrics.

Lightning 2 removed `training_epoch_end(outputs)`; its migration note says to keep what
the epoch metric needs in a list yourself and clear it in `on_train_epoch_end`. This
module appends each step's logits there without `.detach()`: every entry keeps its
logits and the autograd graph behind them, so memory grows step after step through the
(long) epoch and runs out before the epoch ends to clear the list.
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
VOCAB, SEQ, HIDDEN, SEQUENCES, BATCH = 2000, 64, 64, 16384, 32


def cap_address_space(budget_bytes: int) -> None:
    """Allow this process `budget_bytes` more address space, so it fails in seconds."""
    with open("/proc/self/statm") as statm:
        mapped = int(statm.read().split()[0]) * resource.getpagesize()
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    soft = mapped + budget_bytes
    resource.setrlimit(resource.RLIMIT_AS, (soft if hard < 0 else min(soft, hard), hard))


class TinyLanguageModel(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, HIDDEN)
        self.mlp = nn.Sequential(nn.Linear(HIDDEN, HIDDEN), nn.GELU())
        self.head = nn.Linear(HIDDEN, VOCAB)
        self.training_step_outputs: list[tuple[torch.Tensor, torch.Tensor]] = []

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.mlp(self.embed(tokens)))

    def training_step(self, batch: tuple[torch.Tensor], index: int) -> torch.Tensor:
        (tokens,) = batch
        inputs, targets = tokens[:, :-1], tokens[:, 1:]
        logits = self(inputs)
        self.training_step_outputs.append((logits, targets))  # BUG: logits with their graph
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten())

    def on_train_epoch_end(self) -> None:
        logits = torch.cat([logits for logits, _ in self.training_step_outputs])
        targets = torch.cat([targets for _, targets in self.training_step_outputs])
        accuracy = (logits.argmax(-1) == targets).float().mean()
        print(f"epoch {self.current_epoch}: accuracy {accuracy.item():.3f}", flush=True)
        self.training_step_outputs.clear()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


def main() -> None:
    pl.seed_everything(0)
    torch.ones(1 << 20).sum()  # start the thread pool before the cap: its stacks count
    # oneDNN reports a failed allocation as "could not create a primitive"; the plain kernels
    # raise the allocator's own error, as on a GPU.
    torch.backends.mkldnn.enabled = False
    cap_address_space(BUDGET_BYTES)
    tokens = torch.randint(VOCAB, (SEQUENCES, SEQ + 1), generator=torch.Generator().manual_seed(0))
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        max_epochs=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tempfile.mkdtemp(prefix="lightning-step-outputs-"),
    )
    trainer.fit(TinyLanguageModel(), DataLoader(TensorDataset(tokens), batch_size=BATCH))


if __name__ == "__main__":
    main()
