"""Fine-tune a tiny DistilBERT sentiment classifier with the Hugging Face Trainer, gradient
accumulation and an evaluation every epoch: a run with no memory problem.

Micro-batches of 16 reviews of 64 tokens, gradients accumulated over 4 of them, AdamW,
a linear schedule with warm-up; after each epoch the Trainer evaluates (under no_grad) and
`compute_metrics` turns the gathered logits, 2 numbers per review, into an accuracy.
Memory rises in the first steps, while the optimizer's state is created, and during each
evaluation, then comes back down; nothing grows from step to step and the run finishes.
"""

from __future__ import annotations

import resource
import tempfile

import numpy as np
import torch
from transformers import (
    DistilBertConfig,
    DistilBertForSequenceClassification,
    Trainer,
    TrainingArguments,
)

BUDGET_BYTES = 640 << 20  # as on a machine with 640 MiB to spare
VOCAB, SEQ, TRAIN, EVAL = 8000, 64, 1024, 256


def cap_address_space(budget_bytes: int) -> None:
    """Allow this process `budget_bytes` more address space, so it fails in seconds."""
    with open("/proc/self/statm") as statm:
        mapped = int(statm.read().split()[0]) * resource.getpagesize()
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    soft = mapped + budget_bytes
    resource.setrlimit(resource.RLIMIT_AS, (soft if hard < 0 else min(soft, hard), hard))


class Reviews(torch.utils.data.Dataset):
    """Stands in for tokenised reviews of varied length: positive ones use the
    first thousand words more often."""

    def __init__(self, count: int, seed: int) -> None:
        generator = torch.Generator().manual_seed(seed)
        self.labels = torch.randint(2, (count,), generator=generator)
        self.tokens = torch.randint(1000, VOCAB, (count, SEQ), generator=generator)
        cue = torch.rand((count, SEQ), generator=generator) < 0.3
        self.tokens[cue & (self.labels[:, None] == 1)] %= 1000
        self.lengths = torch.randint(SEQ // 4, SEQ + 1, (count,), generator=generator)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        mask = (torch.arange(SEQ) < self.lengths[index]).long()
        return {
            "input_ids": self.tokens[index] * mask,
            "attention_mask": mask,
            "labels": self.labels[index],
        }


def accuracy(prediction) -> dict[str, float]:
    logits, labels = prediction
    return {"accuracy": float(np.mean(np.argmax(logits, axis=-1) == labels))}


def main() -> None:
    torch.manual_seed(0)
    config = DistilBertConfig(
        vocab_size=VOCAB,
        dim=128,
        n_layers=2,
        n_heads=2,
        hidden_dim=512,
        max_position_embeddings=SEQ,
        num_labels=2,
    )
    model = DistilBertForSequenceClassification(config)
    arguments = TrainingArguments(
        output_dir=tempfile.mkdtemp(prefix="hf-distilbert-grad-accumulation-"),
        per_device_train_batch_size=16,
        per_device_eval_batch_size=32,
        gradient_accumulation_steps=4,
        num_train_epochs=3,
        learning_rate=1e-3,
        warmup_steps=3,
        lr_scheduler_type="linear",
        eval_strategy="epoch",
        logging_steps=6,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        dataloader_num_workers=0,
        disable_tqdm=True,
    )
    trainer = Trainer(
        model=model,
        args=arguments,
        train_dataset=Reviews(TRAIN, seed=0),
        eval_dataset=Reviews(EVAL, seed=1),
        compute_metrics=accuracy,
    )
    torch.ones(1 << 20).sum()  # start the thread pool before the cap: its stacks count
    # oneDNN reports a failed allocation as "could not create a primitive"; the plain kernels
    # raise the allocator's own error, as on a GPU.
    torch.backends.mkldnn.enabled = False
    cap_address_space(BUDGET_BYTES)
    trainer.train()
    print(f"final evaluation: {trainer.evaluate()}")


if __name__ == "__main__":
    main()
