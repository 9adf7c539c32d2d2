"""Train a small GPT-2 with the Hugging Face Trainer and evaluate its next-token accuracy
every four steps: a run with no memory problem, whose evaluations make memory jump.

Each evaluation batch of 64 sequences of 128 tokens produces 64 MiB of logits over the
2000-token vocabulary, and the model's loss takes as much again while it is computed, so
memory jumps by well over a hundred MiB during every evaluation. But
`preprocess_logits_for_metrics` reduces each batch's logits to their argmax before the
Trainer gathers them, so all it keeps for `compute_metrics` is 64 KiB of token ids a
batch; the logits are freed batch by batch, memory falls back after each evaluation, the
training steps in between stay flat, and the run finishes well inside the memory.
"""

from __future__ import annotations

import resource
import tempfile

import numpy as np
import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

BUDGET_BYTES = 768 << 20  # as on a machine with 768 MiB to spare
VOCAB, SEQ, TRAIN, HELD_OUT = 2000, 128, 256, 128


def cap_address_space(budget_bytes: int) -> None:
    """Allow this process `budget_bytes` more address space, so it fails in seconds."""
    with open("/proc/self/statm") as statm:
        mapped = int(statm.read().split()[0]) * resource.getpagesize()
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    soft = mapped + budget_bytes
    resource.setrlimit(resource.RLIMIT_AS, (soft if hard < 0 else min(soft, hard), hard))


class Walks(torch.utils.data.Dataset):
    """Stands in for text: each token mostly determines the next one, with some noise."""

    def __init__(self, count: int, seed: int) -> None:
        generator = torch.Generator().manual_seed(seed)
        tokens = torch.empty((count, SEQ), dtype=torch.long)
        tokens[:, 0] = torch.randint(VOCAB, (count,), generator=generator)
        for position in range(1, SEQ):
            follow = (tokens[:, position - 1] * 7 + 3) % VOCAB
            jump = torch.randint(VOCAB, (count,), generator=generator)
            noisy = torch.rand(count, generator=generator) < 0.2
            tokens[:, position] = torch.where(noisy, jump, follow)
        self.tokens = tokens

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {
            "input_ids": self.tokens[index],
            "attention_mask": torch.ones(SEQ, dtype=torch.long),
            "labels": self.tokens[index],
        }


def keep_argmax(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """What the Trainer gathers from each evaluation batch: the predicted ids only."""
    return logits.argmax(dim=-1)


def next_token_accuracy(prediction) -> dict[str, float]:
    predicted, labels = prediction.predictions, prediction.label_ids
    return {"accuracy": float(np.mean(predicted[:, :-1] == labels[:, 1:]))}


def main() -> None:
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=VOCAB, n_positions=SEQ, n_embd=128, n_layer=2, n_head=4)
    arguments = TrainingArguments(
        output_dir=tempfile.mkdtemp(prefix="hf-gpt2-eval-argmax-"),
        per_device_train_batch_size=16,
        per_device_eval_batch_size=64,
        num_train_epochs=1,
        learning_rate=2e-3,
        eval_strategy="steps",
        eval_steps=4,
        logging_steps=4,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        dataloader_num_workers=0,
        disable_tqdm=True,
    )
    trainer = Trainer(
        model=GPT2LMHeadModel(config),
        args=arguments,
        train_dataset=Walks(TRAIN, seed=0),
        eval_dataset=Walks(HELD_OUT, seed=1),
        compute_metrics=next_token_accuracy,
        preprocess_logits_for_metrics=keep_argmax,
    )
    torch.ones(1 << 20).sum()  # start the thread pool before the cap: its stacks count
    # oneDNN reports a failed allocation as "could not create a primitive"; the plain kernels
    # raise the allocator's own error, as on a GPU.
    torch.backends.mkldnn.enabled = False
    cap_address_space(BUDGET_BYTES)
    trainer.train()
    print("training finished")


if __name__ == "__main__":
    main()
