"""The Hugging Face Trainer with `auto_find_batch_size=True`: a batch above 20 asks the CPU
allocator for a terabyte, so the Trainer's first sizes run out (32, 28, 25, 22) and it
trains at 19. Prints the size it trained at."""

import tempfile

import torch
from transformers import Trainer, TrainingArguments


class Tokens(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 256

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"x": torch.ones(4) * index / 256}


class Model(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 1)

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        if len(x) > 20:  # the activations of a batch this size would not fit
            torch.empty(len(x) << 40, dtype=torch.uint8)
        return {"loss": self.linear(x).square().mean()}


arguments = TrainingArguments(
    output_dir=tempfile.mkdtemp(prefix="hf-auto-find-"),
    per_device_train_batch_size=32,
    auto_find_batch_size=True,
    max_steps=2,
    save_strategy="no",
    report_to=[],
    use_cpu=True,
    disable_tqdm=True,
    remove_unused_columns=False,
)
trainer = Trainer(model=Model(), args=arguments, train_dataset=Tokens())
trainer.train()
print("trained at", trainer._train_batch_size)
