"""Fine-tune a small GPT-2 with the Hugging Face Trainer on long sequences, batch 16.

The batch was raised together with the sequence length: 16 sequences of 512 tokens. One
step's working set (attention, MLP activations saved for backward, the logits and their
gradient) is more than twice the memory there is, and the first training step runs out.
A quarter of the batch (4 sequences) with 4 steps of gradient accumulation trains.
"""

from __future__ import annotations

import resource
import tempfile

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

BUDGET_BYTES = 512 << 20  # as on a machine with 512 MiB to spare
VOCAB, SEQ, BATCH = 2000, 512, 16


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


def main() -> None:
    torch.manual_seed(0)
    config = GPT2Config(
        vocab_size=VOCAB,
        n_positions=SEQ,
        n_embd=128,
        n_layer=4,
        n_head=2,
        bos_token_id=0,
        eos_token_id=0,
    )
    model = GPT2LMHeadModel(config)
    arguments = TrainingArguments(
        output_dir=tempfile.mkdtemp(prefix="hf-long-sequences-"),
        per_device_train_batch_size=BATCH,
        max_steps=20,
        learning_rate=5e-4,
        logging_steps=5,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        dataloader_num_workers=0,
        disable_tqdm=True,
    )
    trainer = Trainer(model=model, args=arguments, train_dataset=RandomTokens(1024))
    torch.ones(1 << 20).sum()  # start the thread pool before the cap: its stacks count
    # oneDNN reports a failed allocation as "could not create a primitive"; the plain kernels
    # raise the allocator's own error, as on a GPU.
    torch.backends.mkldnn.enabled = False
    cap_address_space(BUDGET_BYTES)
    trainer.train()


if __name__ == "__main__":
    main()
