"""A tiny real Lightning fit with memdoc's callback; `oom` makes a training step exceed RAM."""

import json
import resource
import sys

import lightning.pytorch as L
import torch

from memdoc.integrations.lightning import MemdocCallback

trace, mode, result = sys.argv[1], sys.argv[2], sys.argv[3]


class Tiny(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(8, 2)

    def training_step(self, batch, batch_idx):
        if mode == "oom" and self.global_step == 2:
            torch.empty(8 * 2**30, dtype=torch.uint8)  # beyond the address-space cap
        return self.layer(batch[0]).pow(2).mean()

    def validation_step(self, batch, batch_idx):
        return self.layer(batch[0]).sum()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


loader = torch.utils.data.DataLoader(
    torch.utils.data.TensorDataset(torch.randn(12, 8)), batch_size=4
)
callback = MemdocCallback(trace)
trainer = L.Trainer(
    max_epochs=2,
    callbacks=[callback],
    accelerator="cpu",
    logger=False,
    enable_checkpointing=False,
    enable_progress_bar=False,
    enable_model_summary=False,
    accumulate_grad_batches=3 if mode == "accumulate" else 1,
)
if mode == "oom":
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    with open("/proc/self/statm") as statm:
        size_bytes = int(statm.read().split()[0]) * resource.getpagesize()
    resource.setrlimit(resource.RLIMIT_AS, (size_bytes + 2 * 2**30, hard))
error = None
try:
    trainer.fit(Tiny(), loader, loader)
except RuntimeError as exc:
    error = f"{type(exc).__name__}: {exc}"
with open(result, "w") as out:
    json.dump(
        {"global_step": trainer.global_step, "diagnosis": callback.diagnosis, "error": error}, out
    )
