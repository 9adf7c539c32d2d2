"""Train a small GPT-2 with the Hugging Face Trainer and `auto_find_batch_size=True`.

The batch asked for (192 sequences of 128 tokens) is more than the memory holds: the first
training step runs out, the Trainer catches the out-of-memory error, retries its whole
training loop with a smaller batch, and so on until a size fits; the run then finishes.
"""

from __future__ import annotations

import resource
import tempfile

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

BUDGET_BYTES = 768 << 20  # as on a machine with 768 MiB to spare
VOCAB, SEQ, SEQUENCES = 1000, 128, 4096


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
        self.tokens = torch.randint(VOCAB, (count, SEQ), generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.tokens[index], "labels": self.tokens[index]}


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
    output_dir = tempfile.mkdtemp(prefix="hf-auto-find-")
    arguments = TrainingArguments(
        output_dir=output_dir,
        per_device_train_batch_size=192,
        auto_find_batch_size=True,
        max_steps=3,
        learning_rate=1e-3,
        logging_steps=2,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        dataloader_num_workers=0,
        disable_tqdm=True,
    )
    trainer = Trainer(model=model, args=arguments, train_dataset=RandomTokens(SEQUENCES))
    torch.ones(1 << 20).sum()  # start the thread pool before the cap: its stacks count
    # oneDNN reports a failed allocation as "could not create a primitive"; the plain kernels
    # raise the allocator's own error, as on a GPU.
    torch.backends.mkldnn.enabled = False
    cap_address_space(BUDGET_BYTES)
    trainer.train()
    print(f"trained at batch size {trainer._train_batch_size}")


if __name__ == "__main__":
    main()
