"""Pre-train a tiny BERT (masked language modelling) with a Hugging Face Trainer subclass
that keeps every step's logits for a training accuracy.

The subclass overrides `compute_loss` to append each batch's MLM logits (8 x 64 tokens x
an 8000-word vocabulary, 16 MiB) and labels to lists, meaning to report the masked-token
accuracy over the epoch at its end. Nothing reads the lists until then, so memory grows
by one batch of logits a step and the run runs out after a few dozen steps, long before the
epoch ends. (Count the correct predictions as a number each step instead.)
"""

from __future__ import annotations

import resource
import tempfile

import torch
from transformers import BertConfig, BertForMaskedLM, Trainer, TrainingArguments

BUDGET_BYTES = 512 << 20  # as on a machine with 512 MiB to spare
VOCAB, SEQ, MASK_ID, MASKED = 8000, 64, 3, 0.15


def cap_address_space(budget_bytes: int) -> None:
    """Allow this process `budget_bytes` more address space, so it fails in seconds."""
    with open("/proc/self/statm") as statm:
        mapped = int(statm.read().split()[0]) * resource.getpagesize()
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    soft = mapped + budget_bytes
    resource.setrlimit(resource.RLIMIT_AS, (soft if hard < 0 else min(soft, hard), hard))


class MaskedSentences(torch.utils.data.Dataset):
    """Stands in for a tokenised corpus, with 15% of the tokens masked."""

    def __init__(self, count: int) -> None:
        generator = torch.Generator().manual_seed(0)
        self.tokens = torch.randint(10, VOCAB, (count, SEQ), generator=generator)
        self.masked = torch.rand((count, SEQ), generator=generator) < MASKED

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        tokens, masked = self.tokens[index], self.masked[index]
        return {
            "input_ids": torch.where(masked, MASK_ID, tokens),
            "attention_mask": torch.ones(SEQ, dtype=torch.long),
            "labels": torch.where(masked, tokens, -100),
        }


class AccuracyTrainer(Trainer):
    """Keeps each step's predictions to report the masked-token accuracy of the epoch."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.epoch_logits: list[torch.Tensor] = []
        self.epoch_labels: list[torch.Tensor] = []

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        outputs = model(**inputs)
        self.epoch_logits.append(outputs.logits)  # BUG: 16 MiB kept every step
        self.epoch_labels.append(inputs["labels"])
        return (outputs.loss, outputs) if return_outputs else outputs.loss

    def epoch_accuracy(self) -> float:
        hits = seen = 0
        for logits, labels in zip(self.epoch_logits, self.epoch_labels, strict=True):
            scored = labels != -100
            hits += (logits.argmax(-1)[scored] == labels[scored]).sum().item()
            seen += scored.sum().item()
        return hits / max(seen, 1)


def main() -> None:
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=VOCAB,
        hidden_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=512,
        max_position_embeddings=SEQ,
    )
    model = BertForMaskedLM(config)
    arguments = TrainingArguments(
        output_dir=tempfile.mkdtemp(prefix="hf-bert-kept-logits-"),
        per_device_train_batch_size=8,
        num_train_epochs=1,
        learning_rate=5e-4,
        logging_steps=10,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        dataloader_num_workers=0,
        disable_tqdm=True,
    )
    trainer = AccuracyTrainer(model=model, args=arguments, train_dataset=MaskedSentences(4096))
    torch.ones(1 << 20).sum()  # start the thread pool before the cap: its stacks count
    # oneDNN reports a failed allocation as "could not create a primitive"; the plain kernels
    # raise the allocator's own error, as on a GPU.
    torch.backends.mkldnn.enabled = False
    cap_address_space(BUDGET_BYTES)
    trainer.train()
    print(f"masked-token accuracy over the epoch: {trainer.epoch_accuracy():.4f}")


if __name__ == "__main__":
    main()
