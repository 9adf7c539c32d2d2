"""Train a text classifier with Lightning whose running feature centre is carried from step
to step with its graph, and whose backward was given retain_graph=True to hide the error.

The model reads each document as a bag of hashed words (log-scaled counts in 16384
buckets, built in `forward`). After the first layer it subtracts a running centre of its
hidden features, an exponential average of each batch's mean, updated in `forward` without
`torch.no_grad()`: each step's centre is a function of every earlier batch's features, so
the new step's graph reaches back into all the earlier ones. At the second step Lightning's
backward raised "Trying to backward through the graph a second time"; the author overrode
the module's `backward` hook to call `loss.backward(retain_graph=True)`, and the error went
away. Now no step's graph is ever freed: every step keeps its batch of input vectors
(512 x 16384 floats, 32 MiB), saved for the first layer's weight gradient, and every
backward runs through all of them again, so memory grows by a batch a step and the fit
runs out after about a dozen steps. (Update the centre under `torch.no_grad()`, or from
`hidden.detach()`, and drop retain_graph: the fit then trains under the same cap.)
"""

from __future__ import annotations

import resource
import tempfile

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset

BUDGET_BYTES = 640 << 20  # as on a machine with 640 MiB to spare
BUCKETS, WORDS, HIDDEN, CLASSES, DOCUMENTS, BATCH = 16384, 96, 64, 4, 32768, 512


def cap_address_space(budget_bytes: int) -> None:
    """Allow this process `budget_bytes` more address space, so it fails in seconds."""
    with open("/proc/self/statm") as statm:
        mapped = int(statm.read().split()[0]) * resource.getpagesize()
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    soft = mapped + budget_bytes
    resource.setrlimit(resource.RLIMIT_AS, (soft if hard < 0 else min(soft, hard), hard))


class HashedDocuments(Dataset):
    """Stands in for a hashed corpus: each topic favours its own range of buckets."""

    def __init__(self, count: int) -> None:
        generator = torch.Generator().manual_seed(0)
        self.labels = torch.randint(CLASSES, (count,), generator=generator)
        topical = self.labels[:, None] * (BUCKETS // CLASSES)
        topical = topical + torch.randint(
            BUCKETS // CLASSES, (count, WORDS // 3), generator=generator
        )
        common = torch.randint(BUCKETS, (count, WORDS - WORDS // 3), generator=generator)
        self.words = torch.cat([topical, common], dim=1)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.words[index], self.labels[index]


class CentredClassifier(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.encode = nn.Linear(BUCKETS, HIDDEN)
        self.head = nn.Linear(HIDDEN, CLASSES)
        self.centre = torch.zeros(HIDDEN)

    def forward(self, words: torch.Tensor) -> torch.Tensor:
        counts = torch.zeros(len(words), BUCKETS).scatter_add_(1, words, torch.ones(words.shape))
        hidden = F.relu(self.encode(torch.log1p(counts)))  # log-scaled bucket counts
        if self.training:
            # BUG: the centre keeps the graph of every batch it has averaged (use no_grad)
            self.centre = 0.9 * self.centre + 0.1 * hidden.mean(dim=0)
        return self.head(hidden - self.centre)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], index: int) -> torch.Tensor:
        words, labels = batch
        loss = F.cross_entropy(self(words), labels)
        self.log("train_loss", loss, prog_bar=False)
        if index % 4 == 0:
            print(f"step {index}: loss {loss.item():.3f}", flush=True)
        return loss

    def backward(self, loss: torch.Tensor, *args, **kwargs) -> None:
        # BUG: added to silence "Trying to backward through the graph a second time"
        loss.backward(retain_graph=True)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


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
        max_epochs=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tempfile.mkdtemp(prefix="lightning-running-centre-"),
    )
    loader = DataLoader(HashedDocuments(DOCUMENTS), batch_size=BATCH, shuffle=True)
    trainer.fit(CentredClassifier(), loader)
    print("fit finished")


if __name__ == "__main__":
    main()
