"""Train a text classifier with Lightning and check its calibration by hand at each epoch's
end.

`on_train_epoch_end` runs a hand-written pass over the held-out set in large batches and
keeps each batch's softmax probabilities for the calibration metric. Lightning turns
autograd off in its own validation loop, but this hook runs inside the training loop with
autograd on: every kept probability tensor holds its batch's whole graph (the per-token
hidden activations), and memory grows batch after batch until the evaluation runs out.
Under `torch.no_grad()` the kept probabilities are a few KiB a batch.
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
VOCAB, SEQ, DIM, CLASSES = 20000, 256, 64, 4
TRAIN_ROWS, HELD_ROWS, BATCH, EVAL_BATCH = 2048, 8192, 64, 512


def cap_address_space(budget_bytes: int) -> None:
    """Allow this process `budget_bytes` more address space, so it fails in seconds."""
    with open("/proc/self/statm") as statm:
        mapped = int(statm.read().split()[0]) * resource.getpagesize()
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    soft = mapped + budget_bytes
    resource.setrlimit(resource.RLIMIT_AS, (soft if hard < 0 else min(soft, hard), hard))


def make_rows(count: int, seed: int) -> TensorDataset:
    """Stands in for tokenised documents: the label shifts which words are common."""
    generator = torch.Generator().manual_seed(seed)
    labels = torch.randint(CLASSES, (count,), generator=generator)
    words = torch.randint(VOCAB // 2, (count, SEQ), generator=generator)
    words[:, ::4] += (VOCAB // 2) * (labels[:, None] % 2)
    return TensorDataset(words, labels)


class TextClassifier(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.token_mlp = nn.Sequential(nn.Linear(DIM, DIM), nn.GELU())
        self.head = nn.Linear(DIM, CLASSES)
        self.held = make_rows(HELD_ROWS, seed=1)

    def forward(self, words: torch.Tensor) -> torch.Tensor:
        return self.head(self.token_mlp(self.embed(words)).mean(dim=1))

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], index: int) -> torch.Tensor:
        words, labels = batch
        return F.cross_entropy(self(words), labels)

    def on_train_epoch_end(self) -> None:
        # BUG: no torch.no_grad() here: each kept tensor keeps its batch's graph
        probabilities, labels = [], []
        for words, y in DataLoader(self.held, batch_size=EVAL_BATCH):
            probabilities.append(self(words).softmax(-1))
            labels.append(y)
        confidence, predicted = torch.cat(probabilities).max(-1)
        gap = (confidence - (predicted == torch.cat(labels)).float()).mean()
        print(f"epoch {self.current_epoch}: calibration gap {gap.item():.3f}", flush=True)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


def main() -> None:
    pl.seed_everything(0)
    torch.ones(1 << 20).sum()  # start the thread pool before the cap: its stacks count
    # oneDNN reports a failed allocation as "could not create a primitive"; the plain kernels
    # raise the allocator's own error, as on a GPU.
    torch.backends.mkldnn.enabled = False
    cap_address_space(BUDGET_BYTES)
    model = TextClassifier()
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        max_epochs=2,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tempfile.mkdtemp(prefix="lightning-epoch-end-eval-"),
    )
    trainer.fit(model, DataLoader(make_rows(TRAIN_ROWS, seed=0), batch_size=BATCH, shuffle=True))


if __name__ == "__main__":
    main()
