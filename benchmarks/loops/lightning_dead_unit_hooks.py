"""Train a tabular MLP with Lightning while forward hooks collect every ReLU's output, to
count the units that never fire over the epoch.

In `on_fit_start` the module registers a forward hook on each of its three ReLUs; the hook
appends the layer's output to a list, and `on_train_epoch_end` was to stack them and
report the fraction of dead units. The outputs are kept as they are, batch after batch:
with batches of 256 rows and 2048 units per layer that is 2 MiB a layer, 6 MiB a step,
never released. The weights, their gradients and AdamW's moments take 136 MiB and a step
needs little more, but the kept outputs grow by 6 MiB a step and the fit runs out after
25 to 35 steps, long before the epoch's 128 steps end. (Keep a running "ever fired"
mask per layer instead, `seen |= (output > 0).any(dim=0)` under `torch.no_grad()`:
2048 booleans a layer, and the fit trains under the same cap.)
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
FEATURES, WIDTH, CLASSES, ROWS, BATCH = 256, 2048, 10, 32768, 256


def cap_address_space(budget_bytes: int) -> None:
    """Allow this process `budget_bytes` more address space, so it fails in seconds."""
    with open("/proc/self/statm") as statm:
        mapped = int(statm.read().split()[0]) * resource.getpagesize()
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    soft = mapped + budget_bytes
    resource.setrlimit(resource.RLIMIT_AS, (soft if hard < 0 else min(soft, hard), hard))


def make_rows(count: int) -> TensorDataset:
    """Stands in for a feature table: each class shifts its own block of columns."""
    generator = torch.Generator().manual_seed(0)
    labels = torch.randint(CLASSES, (count,), generator=generator)
    rows = torch.randn((count, FEATURES), generator=generator)
    block = FEATURES // CLASSES
    for label in range(CLASSES):
        rows[labels == label, label * block : (label + 1) * block] += 0.5
    return TensorDataset(rows, labels)


class TabularClassifier(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Linear(FEATURES, WIDTH),
            nn.ReLU(),
            nn.Linear(WIDTH, WIDTH),
            nn.ReLU(),
            nn.Linear(WIDTH, WIDTH),
            nn.ReLU(),
        )
        self.head = nn.Linear(WIDTH, CLASSES)
        self.outputs: dict[str, list[torch.Tensor]] = {}

    def on_fit_start(self) -> None:
        for name, layer in self.body.named_children():
            if isinstance(layer, nn.ReLU):
                self.outputs[name] = []
                layer.register_forward_hook(self.keep_output(name))

    def keep_output(self, name: str):
        def hook(module: nn.Module, inputs: tuple[torch.Tensor], output: torch.Tensor) -> None:
            self.outputs[name].append(output)  # BUG: every batch's activations, kept

        return hook

    def on_train_epoch_end(self) -> None:
        for name, kept in self.outputs.items():
            fired = torch.stack([(output > 0).any(dim=0) for output in kept]).any(dim=0)
            print(f"relu {name}: {1 - fired.float().mean().item():.1%} dead units")
            kept.clear()

    def forward(self, rows: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(rows))

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], index: int) -> torch.Tensor:
        rows, labels = batch
        loss = F.cross_entropy(self(rows), labels)
        if index % 10 == 0:
            print(f"step {index}: loss {loss.item():.3f}", flush=True)
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
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        max_epochs=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tempfile.mkdtemp(prefix="lightning-dead-unit-hooks-"),
    )
    loader = DataLoader(make_rows(ROWS), batch_size=BATCH, shuffle=True)
    trainer.fit(TabularClassifier(), loader)
    print("fit finished")


if __name__ == "__main__":
    main()
