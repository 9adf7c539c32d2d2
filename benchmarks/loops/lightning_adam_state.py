"""Train a bag-of-words text classifier with Lightning and AdamW: the optimizer state does
not fit.

The model is one large embedding table (400,000 words x 128, 195 MiB of float32) and a
small head. Its weights fit, and so do their gradients after the first backward pass. The
first `optimizer.step()` then creates AdamW's two state tensors per parameter, another
390 MiB, and runs out while creating them, before any weight is updated. (SGD, a sparse
or 8-bit optimizer, or a smaller vocabulary would train.)
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
VOCAB, DIM, CLASSES, WORDS, DOCUMENTS, BATCH = 400_000, 128, 4, 32, 2048, 64


def cap_address_space(budget_bytes: int) -> None:
    """Allow this process `budget_bytes` more address space, so it fails in seconds."""
    with open("/proc/self/statm") as statm:
        mapped = int(statm.read().split()[0]) * resource.getpagesize()
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    soft = mapped + budget_bytes
    resource.setrlimit(resource.RLIMIT_AS, (soft if hard < 0 else min(soft, hard), hard))


class BagOfWords(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.EmbeddingBag(VOCAB, DIM, mode="mean")
        self.head = nn.Linear(DIM, CLASSES)

    def forward(self, words: torch.Tensor) -> torch.Tensor:
        return self.head(self.embed(words))

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], index: int) -> torch.Tensor:
        words, labels = batch
        loss = F.cross_entropy(self(words), labels)
        self.log("loss", loss, prog_bar=False)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


def main() -> None:
    pl.seed_everything(0)
    torch.ones(1 << 20).sum()  # start the thread pool before the cap: its stacks count
    # oneDNN reports a failed allocation as "could not create a primitive"; the plain kernels
    # raise the allocator's own error, as on a GPU.
    torch.backends.mkldnn.enabled = False
    cap_address_space(BUDGET_BYTES)
    generator = torch.Generator().manual_seed(0)
    words = torch.randint(VOCAB, (DOCUMENTS, WORDS), generator=generator)
    labels = torch.randint(CLASSES, (DOCUMENTS,), generator=generator)
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        max_epochs=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tempfile.mkdtemp(prefix="lightning-adam-state-"),
    )
    trainer.fit(BagOfWords(), DataLoader(TensorDataset(words, labels), batch_size=BATCH))


if __name__ == "__main__":
    main()
