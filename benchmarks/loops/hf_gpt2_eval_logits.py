"""Train a small GPT-2 with the Hugging Face Trainer, evaluating token accuracy as it goes.

Evaluation runs under no_grad, as the Trainer does, but `compute_metrics` needs the
predictions, so the Trainer keeps every evaluation batch's logits (sequence x vocabulary
floats) until the evaluation set is done. The evaluation set's logits do not fit: memory
grows batch after batch during the first evaluation until it runs out. (The fix is
`preprocess_logits_for_metrics` returning the argmax, or `eval_accumulation_steps`.)
"""

from __future__ import annotations

import resource
import tempfile

import numpy as np
import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

BUDGET_BYTES = 512 << 20  # as on a machine with 512 MiB to spare
VOCAB, SEQ = 2000, 128


def cap_address_space(budget_bytes: int) -> None:
    """Allow this process `budget_bytes` more address space, so it fails in seconds."""
    with open("/proc/self/statm") as statm:
        mapped = int(statm.read().split()[0]) * resource.getpagesize()
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    soft = mapped + budget_bytes
    resource.setrlimit(resource.RLIMIT_AS, (soft if hard < 0 else min(soft, hard), hard))


class RandomTokens(torch.utils.data.Dataset):
    """Stands in for a tokenised corpus."""

    def __init__(self, count: int, seed: int) -> None:
        generator = torch.Generator().manual_seed(seed)
        self.tokens = torch.randint(VOCAB, (count, SEQ), generator=generator)

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.tokens[index], "labels": self.tokens[index]}


def token_accuracy(prediction: tuple[np.ndarray, np.ndarray]) -> dict[str, float]:
    logits, labels = prediction
    return {"accuracy": float((logits[:, :-1].argmax(-1) == labels[:, 1:]).mean())}


def main() -> None:
    torch.manual_seed(0)
    config = GPT2Config(
        vocab_size=VOCAB,
        n_positions=SEQ,
        n_embd=64,
        n_layer=2,
        n_head=2,
        bos_token_id=0,
        eos_token_id=0,
    )
    model = GPT2LMHeadModel(config)
    arguments = TrainingArguments(
        output_dir=tempfile.mkdtemp(prefix="hf-eval-logits-"),
        per_device_train_batch_size=16,
        per_device_eval_batch_size=16,
        max_steps=12,
        eval_strategy="steps",
        eval_steps=6,
        learning_rate=1e-3,
        logging_steps=3,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        dataloader_num_workers=0,
        disable_tqdm=True,
    )
    trainer = Trainer(
        model=model,
        args=arguments,
        train_dataset=RandomTokens(2048, seed=0),
        eval_dataset=RandomTokens(1024, seed=1),
        compute_metrics=token_accuracy,
    )
    torch.ones(1 << 20).sum()  # start the thread pool before the cap: its stacks count
    # oneDNN reports a failed allocation as "could not create a primitive"; the plain kernels
    # raise the allocator's own error, as on a GPU.
    torch.backends.mkldnn.enabled = False
    cap_address_space(BUDGET_BYTES)
    trainer.train()


if __name__ == "__main__":
    main()
