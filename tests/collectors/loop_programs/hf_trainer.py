"""The Hugging Face Trainer: a tiny randomly initialised model, `train` with evaluation every
epoch, then `evaluate` and `predict`, with no memdoc callback."""

import torch
from torch.utils.data import Dataset
from transformers import Trainer, TrainingArguments


class Pairs(Dataset):
    def __len__(self) -> int:
        return 32

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        x = torch.full((4,), float(i))
        return {"x": x, "labels": x.sum(dim=0, keepdim=True)}


class Tiny(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def forward(self, x, labels=None):
        out = self.layer(x)
        loss = torch.nn.functional.mse_loss(out, labels) if labels is not None else None
        return {"loss": loss, "logits": out}


args = TrainingArguments(
    output_dir="hf-out",
    per_device_train_batch_size=8,
    per_device_eval_batch_size=8,
    num_train_epochs=2,
    max_steps=8,  # the same 2 epochs of 4 steps, said up front: the phase's planned steps
    eval_strategy="epoch",
    save_strategy="no",
    report_to=[],
    use_cpu=True,
    disable_tqdm=True,
    logging_strategy="no",
)
trainer = Trainer(model=Tiny(), args=args, train_dataset=Pairs(), eval_dataset=Pairs())
trainer.train()
trainer.evaluate()
trainer.predict(Pairs())
print("ok")
