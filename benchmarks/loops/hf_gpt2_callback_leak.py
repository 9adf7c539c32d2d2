"""Train a small GPT-2 with the Hugging Face Trainer and a callback that tracks weight drift.

The callback keeps a copy of the model's weights after every step, to plot how far the
weights moved at the end of training. Each copy is the size of the model, so memory grows
by one model a step until it runs out after a few dozen steps.
"""

from __future__ import annotations

import resource
import tempfile

import torch
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)

BUDGET_BYTES = 512 << 20  # as on a machine with 512 MiB to spare
VOCAB, SEQ = 4000, 32


def cap_address_space(budget_bytes: int) -> None:
    """Allow this process `budget_bytes` more address space, so it fails in seconds."""
    with open("/proc/self/statm") as statm:
        mapped = int(statm.read().split()[0]) * resource.getpagesize()
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    soft = mapped + budget_bytes
    resource.setrlimit(resource.RLIMIT_AS, (soft if hard < 0 else min(soft, hard), hard))


class RandomTokens(torch.utils.data.Dataset):
    """Stands in for a tokenised corpus."""

    def __init__(self, count: int) -> None:
        generator = torch.Generator().manual_seed(0)
        self.tokens = torch.randint(VOCAB, (count, SEQ), generator=generator)

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.tokens[index], "labels": self.tokens[index]}


class WeightDrift(TrainerCallback):
    """Keeps the weights after every step, to plot the drift from the start at the end."""

    def __init__(self) -> None:
        self.snapshots: list[dict[str, torch.Tensor]] = []

    def on_step_end(self, args, state, control, model=None, **kwargs):
        # BUG: a full copy of the model every step (keep a running norm instead)
        self.snapshots.append({k: v.detach().clone() for k, v in model.state_dict().items()})

    def on_train_end(self, args, state, control, model=None, **kwargs):
        first = self.snapshots[0]
        for step, weights in enumerate(self.snapshots, start=1):
            drift = sum((weights[k] - first[k]).norm() ** 2 for k in first) ** 0.5
            print(f"step {step}: drift {drift:.4f}")


def main() -> None:
    torch.manual_seed(0)
    config = GPT2Config(
        vocab_size=VOCAB,
        n_positions=SEQ,
        n_embd=256,
        n_layer=4,
        n_head=4,
        bos_token_id=0,
        eos_token_id=0,
    )
    model = GPT2LMHeadModel(config)
    arguments = TrainingArguments(
        output_dir=tempfile.mkdtemp(prefix="hf-callback-leak-"),
        per_device_train_batch_size=2,
        max_steps=200,
        learning_rate=1e-3,
        logging_steps=10,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        dataloader_num_workers=0,
        disable_tqdm=True,
    )
    trainer = Trainer(
        model=model,
        args=arguments,
        train_dataset=RandomTokens(4096),
        callbacks=[WeightDrift()],
    )
    torch.ones(1 << 20).sum()  # start the thread pool before the cap: its stacks count
    # oneDNN reports a failed allocation as "could not create a primitive"; the plain kernels
    # raise the allocator's own error, as on a GPU.
    torch.backends.mkldnn.enabled = False
    cap_address_space(BUDGET_BYTES)
    trainer.train()


if __name__ == "__main__":
    main()
