"""Train an insurance-claim fraud classifier with Lightning and, every 50 steps, pick the
claims to send to human adjusters next by scoring the whole unlabelled pool, without
turning autograd off.

Each claim is 40 categorical fields (policy type, region, repair shop, ...), each embedded
in 64 dimensions from one shared table of 40 x 1000 rows (10 MiB), and a small MLP on
their concatenation. Training on batches of 256 labelled claims needs a few MiB a step.
Every 50 steps a callback scores the 65,536 unlabelled claims by the entropy of the
model's prediction, in batches of 4096, under `model.eval()` (to turn dropout off), and
keeps every batch's scores to pick the 512 most uncertain claims. But it runs inside the
training loop, where autograd is on: each batch's scores hold its graph, with the
concatenated embeddings (10 KiB a claim) that the first linear layer saved for backward,
40 MiB a batch, so memory grows batch after batch through the scoring, toward 640 MiB for
the pool against 512 MiB of memory, and the first scoring runs out partway
through, though the model, its Adam state and the data take under 60 MiB. (Score the
pool under `torch.no_grad()`: a batch's scores are then 16 KiB, and it trains under the
same cap.)
"""

from __future__ import annotations

import resource
import tempfile

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

BUDGET_BYTES = 512 << 20  # as on a machine with 512 MiB to spare
FIELDS, VALUES, DIM, HIDDEN = 40, 1000, 64, 128
LABELLED, POOL, BATCH, POOL_BATCH, EVERY, PICK = 25_600, 65_536, 256, 4096, 50, 512


def cap_address_space(budget_bytes: int) -> None:
    """Allow this process `budget_bytes` more address space, so it fails in seconds."""
    with open("/proc/self/statm") as statm:
        mapped = int(statm.read().split()[0]) * resource.getpagesize()
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    soft = mapped + budget_bytes
    resource.setrlimit(resource.RLIMIT_AS, (soft if hard < 0 else min(soft, hard), hard))


def make_claims(count: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Stands in for claims: a few repair shops and regions make fraud likely."""
    fields = torch.randint(VALUES, (count, FIELDS), generator=generator)
    risky = (fields[:, 3] < 30) | ((fields[:, 7] < 100) & (fields[:, 11] < 200))
    flipped = torch.rand(count, generator=generator) < 0.05
    return fields + VALUES * torch.arange(FIELDS), (risky ^ flipped).long()


class FraudClassifier(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(FIELDS * VALUES, DIM)
        self.mlp = nn.Sequential(
            nn.Linear(FIELDS * DIM, HIDDEN), nn.ReLU(), nn.Dropout(0.2), nn.Linear(HIDDEN, 2)
        )

    def forward(self, fields: torch.Tensor) -> torch.Tensor:
        return self.mlp(self.embed(fields).flatten(1))

    def training_step(self, batch: list[torch.Tensor], index: int) -> torch.Tensor:
        fields, fraud = batch
        loss = F.cross_entropy(self(fields), fraud)
        if index % 25 == 0:
            print(f"step {index}: loss {loss.item():.3f}", flush=True)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=1e-3)


class UncertaintySampling(pl.Callback):
    """Every `every` steps, queue the most uncertain pool claims for the adjusters."""

    def __init__(self, pool: torch.Tensor, every: int) -> None:
        self.pool, self.every = pool, every
        self.queued: list[torch.Tensor] = []

    def on_train_batch_end(self, trainer, module, outputs, batch, index: int) -> None:
        if (index + 1) % self.every:
            return
        module.eval()  # turns dropout off; BUG: autograd stays on
        scores = []
        for start in range(0, len(self.pool), POOL_BATCH):
            probabilities = module(self.pool[start : start + POOL_BATCH]).softmax(dim=-1)
            scores.append(-(probabilities * probabilities.log()).sum(dim=-1))
        module.train()
        chosen = torch.cat(scores).topk(PICK).indices
        self.queued.append(chosen)
        print(f"step {index + 1}: queued {PICK} claims for review", flush=True)


def main() -> None:
    pl.seed_everything(0)
    torch.ones(1 << 20).sum()  # start the thread pool before the cap: its stacks count
    # oneDNN reports a failed allocation as "could not create a primitive"; the plain kernels
    # raise the allocator's own error, as on a GPU.
    torch.backends.mkldnn.enabled = False
    cap_address_space(BUDGET_BYTES)
    generator = torch.Generator().manual_seed(0)
    labelled = TensorDataset(*make_claims(LABELLED, generator))
    pool, _ = make_claims(POOL, generator)  # unlabelled: the answers are not known yet
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        max_epochs=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[UncertaintySampling(pool, EVERY)],
        default_root_dir=tempfile.mkdtemp(prefix="lightning-claims-"),
    )
    trainer.fit(FraudClassifier(), DataLoader(labelled, batch_size=BATCH, shuffle=True))
    print("fit finished")


if __name__ == "__main__":
    main()
