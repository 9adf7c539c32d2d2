"""Fit a matrix-factorisation recommender with Lightning and full-batch L-BFGS, keeping
the optimizer's default history of 100 updates.

`torch.optim.LBFGS` approximates the curvature from its last `history_size` updates and
keeps each one as two flat vectors the size of all the parameters (the step and the change
in gradient). The model is 120,000 user and item vectors of 32 floats, 14.6 MiB, so the
default history of 100 updates grows to 2.9 GiB; it fills by two vectors, 29 MiB, at every
inner iteration, up to five of them in each `optimizer.step(closure)`, from one full-batch
step to the next. Everything else the fit holds (the ratings, the weights and their
gradients, one closure's activations, L-BFGS's own working copies and the line search's)
is a few hundred MiB, and the fit runs out in the L-BFGS step of its fifth or sixth epoch,
long before the history is full. (With `history_size=10` the history stops at 293 MiB and
the same fit trains under the same cap.)
"""

from __future__ import annotations

import resource
import tempfile

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset

BUDGET_BYTES = 1024 << 20  # as on a machine with 1 GiB to spare
USERS, ITEMS, DIM, RATINGS, EPOCHS = 100_000, 20_000, 32, 65_536, 30
HISTORY = 100  # BUG: LBFGS's default; every kept update is two parameter-sized vectors


def cap_address_space(budget_bytes: int) -> None:
    """Allow this process `budget_bytes` more address space, so it fails in seconds."""
    with open("/proc/self/statm") as statm:
        mapped = int(statm.read().split()[0]) * resource.getpagesize()
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    soft = mapped + budget_bytes
    resource.setrlimit(resource.RLIMIT_AS, (soft if hard < 0 else min(soft, hard), hard))


class AllRatings(Dataset):
    """The whole ratings table as one item, for full-batch optimisation."""

    def __init__(self, *columns: torch.Tensor) -> None:
        self.columns = columns

    def __len__(self) -> int:
        return 1

    def __getitem__(self, index: int) -> tuple[torch.Tensor, ...]:
        return self.columns


def make_ratings() -> AllRatings:
    """Stands in for observed ratings: a rank-8 taste model, plus noise."""
    generator = torch.Generator().manual_seed(0)
    tastes = torch.randn((USERS, 8), generator=generator)
    traits = torch.randn((ITEMS, 8), generator=generator)
    users = torch.randint(USERS, (RATINGS,), generator=generator)
    items = torch.randint(ITEMS, (RATINGS,), generator=generator)
    noise = 0.3 * torch.randn(RATINGS, generator=generator)
    ratings = (tastes[users] * traits[items]).sum(dim=1) / 8**0.5 + noise
    return AllRatings(users, items, ratings)


class Factorisation(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.users = nn.Embedding(USERS, DIM)
        self.items = nn.Embedding(ITEMS, DIM)
        nn.init.normal_(self.users.weight, std=0.1)
        nn.init.normal_(self.items.weight, std=0.1)

    def training_step(self, batch: tuple[torch.Tensor, ...], index: int) -> torch.Tensor:
        users, items, ratings = batch
        user_vectors, item_vectors = self.users(users), self.items(items)
        predicted = (user_vectors * item_vectors).sum(dim=1)
        penalty = user_vectors.pow(2).mean() + item_vectors.pow(2).mean()
        return F.mse_loss(predicted, ratings) + 1e-3 * penalty

    def on_train_epoch_end(self) -> None:
        history = self.optimizers().optimizer.state[self.users.weight].get("old_dirs", [])
        print(f"epoch {self.current_epoch}: {len(history)} updates kept", flush=True)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.LBFGS(
            self.parameters(),
            lr=1.0,
            max_iter=5,
            history_size=HISTORY,
            line_search_fn="strong_wolfe",
        )


def main() -> None:
    pl.seed_everything(0)
    torch.ones(1 << 20).sum()  # start the thread pool before the cap: its stacks count
    # oneDNN reports a failed allocation as "could not create a primitive"; the plain kernels
    # raise the allocator's own error, as on a GPU.
    torch.backends.mkldnn.enabled = False
    cap_address_space(BUDGET_BYTES)
    ratings = make_ratings()
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        max_epochs=EPOCHS,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tempfile.mkdtemp(prefix="lightning-lbfgs-history-"),
    )
    loader = DataLoader(ratings, batch_size=None)  # the whole table every step: full-batch
    trainer.fit(Factorisation(), loader)
    print("fit finished")


if __name__ == "__main__":
    main()
