"""Lightning: the batch-size finder (its trials above 20 fail in PyTorch's CPU allocator),
then `fit` with validation every epoch and `predict`, with no memdoc callback."""

import lightning.pytorch as pl
import torch
from lightning.pytorch.tuner import Tuner
from torch.utils.data import DataLoader, TensorDataset


class Model(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.batch_size = 8
        self.layer = torch.nn.Linear(4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] > 20:  # the activations of a batch this size would not fit
            torch.empty(x.shape[0] << 40, dtype=torch.uint8)
        return self.layer(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self(x), y)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val", torch.nn.functional.mse_loss(self(x), y))

    def predict_step(self, batch, batch_idx):
        return self(batch[0])

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self):
        return DataLoader(DATA, batch_size=self.batch_size)

    def val_dataloader(self):
        return DataLoader(DATA, batch_size=8)


DATA = TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
options = dict(
    logger=False,
    enable_checkpointing=False,
    enable_progress_bar=False,
    enable_model_summary=False,
    accelerator="cpu",
    devices=1,
)
model = Model()
tuner_trainer = pl.Trainer(max_epochs=1, **options)
size = Tuner(tuner_trainer).scale_batch_size(
    model, mode="power", steps_per_trial=2, init_val=8, max_trials=6
)
print("finder chose", size)
model.batch_size = 16
# 2 epochs of 4 steps, counted by the fit from its data once set up (no max_steps).
trainer = pl.Trainer(max_epochs=2, num_sanity_val_steps=0, **options)
trainer.fit(model)
trainer.predict(model, DataLoader(DATA, batch_size=16))
