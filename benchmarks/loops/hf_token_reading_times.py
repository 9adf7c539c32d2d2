"""Fine-tune a small BERT to predict every token's reading time (a per-token regression)
with a Hugging Face Trainer subclass whose loss broadcasts by mistake.

The model is `BertForTokenClassification` with one output per token, and
`compute_loss` compares its predictions with the measured reading times by mean squared
error. The predictions are flattened to (N, 1) but the targets to (N,): instead of pairing
them, `F.mse_loss` broadcasts the two to an N x N matrix (PyTorch only warns that the
sizes differ). With batches of 256 sentences of 128 tokens, N is 32768, and the first
step asks for one 4 GiB tensor, four times the memory there is, while everything else the
step holds (a 2.4 MiB model and its activations) is under 800 MiB. (Flatten the
predictions to (N,), e.g. `logits.squeeze(-1)`: the loss is then N numbers and the
fine-tuning trains under the same cap.)
"""

from __future__ import annotations

import resource
import tempfile

import torch
import torch.nn.functional as F
from transformers import BertConfig, BertForTokenClassification, Trainer, TrainingArguments

BUDGET_BYTES = 1024 << 20  # as on a machine with 1 GiB to spare
VOCAB, SEQ, SENTENCES, BATCH = 8000, 128, 2048, 256


def cap_address_space(budget_bytes: int) -> None:
    """Allow this process `budget_bytes` more address space, so it fails in seconds."""
    with open("/proc/self/statm") as statm:
        mapped = int(statm.read().split()[0]) * resource.getpagesize()
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    soft = mapped + budget_bytes
    resource.setrlimit(resource.RLIMIT_AS, (soft if hard < 0 else min(soft, hard), hard))


class ReadingTimes(torch.utils.data.Dataset):
    """Stands in for an eye-tracking corpus: rare words (high ids) are read for longer."""

    def __init__(self, count: int) -> None:
        generator = torch.Generator().manual_seed(0)
        self.tokens = torch.randint(1, VOCAB, (count, SEQ), generator=generator)
        noise = torch.randn((count, SEQ), generator=generator) * 0.1
        self.times = self.tokens.float() / VOCAB + noise  # standardised reading times

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {
            "input_ids": self.tokens[index],
            "attention_mask": torch.ones(SEQ, dtype=torch.long),
            "labels": self.times[index],
        }


class ReadingTimeTrainer(Trainer):
    """Mean squared error between each token's predicted and measured reading time."""

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        times = inputs.pop("labels")
        outputs = model(**inputs)
        predicted = outputs.logits.view(-1, 1)  # BUG: (N, 1) against (N,) broadcasts to N x N
        loss = F.mse_loss(predicted, times.view(-1))
        return (loss, outputs) if return_outputs else loss


def main() -> None:
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=256,
        max_position_embeddings=SEQ,
        num_labels=1,
    )
    model = BertForTokenClassification(config)
    arguments = TrainingArguments(
        output_dir=tempfile.mkdtemp(prefix="hf-token-reading-times-"),
        per_device_train_batch_size=BATCH,
        num_train_epochs=1,
        learning_rate=1e-3,
        logging_steps=2,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        dataloader_num_workers=0,
        disable_tqdm=True,
    )
    trainer = ReadingTimeTrainer(model=model, args=arguments, train_dataset=ReadingTimes(SENTENCES))
    torch.ones(1 << 20).sum()  # start the thread pool before the cap: its stacks count
    # oneDNN reports a failed allocation as "could not create a primitive"; the plain kernels
    # raise the allocator's own error, as on a GPU.
    torch.backends.mkldnn.enabled = False
    cap_address_space(BUDGET_BYTES)
    trainer.train()
    print("fine-tuning finished")


if __name__ == "__main__":
    main()
