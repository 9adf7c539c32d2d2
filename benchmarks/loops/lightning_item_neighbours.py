"""Train an item-embedding recommender with Lightning and list each item's nearest
neighbours at the end of every epoch, all items at once.

The model learns a 32-wide embedding for each of 300,000 items from co-purchase pairs;
training fits easily. `on_train_epoch_end` then scores every item against every other in
one matrix product, `items @ items.T`: a single 300,000 x 300,000 float32 tensor of
360 GB, more than the machine could ever give, and the request fails at once. (Score the
items in chunks of a few thousand rows and keep only each chunk's top-k.)
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
ITEMS, DIM, PAIRS, BATCH, NEIGHBOURS = 300_000, 32, 16384, 512, 5


def cap_address_space(budget_bytes: int) -> None:
    """Allow this process `budget_bytes` more address space, so it fails in seconds."""
    with open("/proc/self/statm") as statm:
        mapped = int(statm.read().split()[0]) * resource.getpagesize()
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    soft = mapped + budget_bytes
    resource.setrlimit(resource.RLIMIT_AS, (soft if hard < 0 else min(soft, hard), hard))


def co_purchases(count: int) -> TensorDataset:
    """Stands in for pairs of items bought together: neighbours in id tend to co-occur."""
    generator = torch.Generator().manual_seed(0)
    first = torch.randint(ITEMS, (count,), generator=generator)
    second = (first + torch.randint(1, 50, (count,), generator=generator)) % ITEMS
    return TensorDataset(first, second)


class ItemEmbedding(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.items = nn.Embedding(ITEMS, DIM, sparse=True)
        nn.init.normal_(self.items.weight, std=0.1)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], index: int) -> torch.Tensor:
        first, second = batch
        anchors = F.normalize(self.items(first), dim=-1)
        positives = F.normalize(self.items(second), dim=-1)
        logits = anchors @ positives.T / 0.1  # in-batch negatives
        loss = F.cross_entropy(logits, torch.arange(len(first)))
        self.log("loss", loss, prog_bar=False)
        return loss

    def on_train_epoch_end(self) -> None:
        with torch.no_grad():
            table = F.normalize(self.items.weight, dim=-1)
            scores = table @ table.T  # BUG: ITEMS x ITEMS at once (360 GB)
            neighbours = scores.topk(NEIGHBOURS + 1, dim=-1).indices[:, 1:]
        print(f"epoch {self.current_epoch}: item 0's neighbours {neighbours[0].tolist()}")

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SparseAdam(self.parameters(), lr=1e-2)


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
        max_epochs=2,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tempfile.mkdtemp(prefix="lightning-item-neighbours-"),
    )
    loader = DataLoader(co_purchases(PAIRS), batch_size=BATCH, shuffle=True)
    trainer.fit(ItemEmbedding(), loader)


if __name__ == "__main__":
    main()
