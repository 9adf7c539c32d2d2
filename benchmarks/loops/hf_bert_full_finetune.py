"""Fine-tune every weight of a BERT-base-sized classifier with the Hugging Face Trainer, on
a machine where the weights fit but the weights and their gradients do not.

The model is `BertForSequenceClassification` at BERT-base's size (12 layers of 768, a
30,522-word vocabulary: 109 million weights, 418 MiB in float32), built here from its
config with random weights where a real run would load them with `from_pretrained`. The
support tickets are short (64 tokens) and the batch is 4, so a step's activations are a
few dozen MiB. But full fine-tuning gives every weight a gradient: backward allocates
another 418 MiB, layer by layer from the top, and with the weights that is 836 MiB, more
than the 768 MiB there is, so the first step runs out in its backward pass, before AdamW
has created any state (which would need 836 MiB more). (Freeze the embeddings and the
first eleven layers and fine-tune the last layer, the pooler and the classifier, 7.7
million weights: their gradients and AdamW's moments take 88 MiB, and it trains under the
same cap; or use a smaller model, or adapters.)
"""

from __future__ import annotations

import resource
import tempfile

import torch
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments

BUDGET_BYTES = 768 << 20  # as on a machine with 768 MiB to spare
VOCAB, SEQ, TICKETS, QUEUES, BATCH = 30_522, 64, 512, 8, 4


def cap_address_space(budget_bytes: int) -> None:
    """Allow this process `budget_bytes` more address space, so it fails in seconds."""
    with open("/proc/self/statm") as statm:
        mapped = int(statm.read().split()[0]) * resource.getpagesize()
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    soft = mapped + budget_bytes
    resource.setrlimit(resource.RLIMIT_AS, (soft if hard < 0 else min(soft, hard), hard))


class SupportTickets(torch.utils.data.Dataset):
    """Stands in for tokenised support tickets routed to one of eight queues."""

    def __init__(self, count: int) -> None:
        generator = torch.Generator().manual_seed(0)
        self.queues = torch.randint(QUEUES, (count,), generator=generator)
        self.tokens = torch.randint(1000, VOCAB, (count, SEQ), generator=generator)
        self.tokens[:, 1:9] = 100 + 8 * self.queues[:, None] + torch.arange(8)
        self.tokens[:, 0] = 101  # [CLS]

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {
            "input_ids": self.tokens[index],
            "attention_mask": torch.ones(SEQ, dtype=torch.long),
            "labels": self.queues[index],
        }


def main() -> None:
    torch.manual_seed(0)
    torch.ones(1 << 20).sum()  # start the thread pool before the cap: its stacks count
    # oneDNN reports a failed allocation as "could not create a primitive"; the plain kernels
    # raise the allocator's own error, as on a GPU.
    torch.backends.mkldnn.enabled = False
    cap_address_space(BUDGET_BYTES)
    config = BertConfig(num_labels=QUEUES, max_position_embeddings=512)  # bert-base-uncased
    model = BertForSequenceClassification(config)  # in real life: from_pretrained(...)
    weights = sum(p.numel() for p in model.parameters())
    print(f"{weights / 1e6:.0f}M weights, {4 * weights >> 20} MiB, all trainable", flush=True)
    arguments = TrainingArguments(
        output_dir=tempfile.mkdtemp(prefix="hf-bert-full-finetune-"),
        per_device_train_batch_size=BATCH,
        num_train_epochs=1,
        learning_rate=2e-5,
        logging_steps=8,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        dataloader_num_workers=0,
        disable_tqdm=True,
    )
    trainer = Trainer(model=model, args=arguments, train_dataset=SupportTickets(TICKETS))
    trainer.train()
    print("fine-tuning finished")


if __name__ == "__main__":
    main()
