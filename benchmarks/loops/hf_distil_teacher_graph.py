"""Distil a six-layer BERT teacher into a two-layer student with a Hugging Face Trainer
subclass whose teacher forward runs with autograd on.

`DistillationTrainer.compute_loss` mixes the student's own loss with the KL divergence
from the teacher's softened predictions. The teacher was put in `eval()` mode, which turns
off dropout but not gradient tracking, and its forward pass is not under
`torch.no_grad()`; its weights still require gradients. So every step records the
teacher's whole graph and keeps its activations for a backward pass that would compute
gradients for all of the teacher's weights, which nothing uses. With batches of 16
reviews of 256 tokens each teacher layer keeps about 108 MiB (its attention
probabilities, 16 x 6 x 256 x 256 floats, are 24 MiB of it), on top of the student's own
activations, and the first step runs out in the teacher's fifth layer. (Run the teacher
under `torch.no_grad()`, or freeze it with `requires_grad_(False)`: only one teacher
layer's activations are alive at a time, and the distillation trains under the same cap.)
"""

from __future__ import annotations

import resource
import tempfile

import torch
import torch.nn.functional as F
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments

BUDGET_BYTES = 768 << 20  # as on a machine with 768 MiB to spare
VOCAB, SEQ, REVIEWS, TEMPERATURE, SOFT_WEIGHT = 8000, 256, 512, 2.0, 0.5


def cap_address_space(budget_bytes: int) -> None:
    """Allow this process `budget_bytes` more address space, so it fails in seconds."""
    with open("/proc/self/statm") as statm:
        mapped = int(statm.read().split()[0]) * resource.getpagesize()
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    soft = mapped + budget_bytes
    resource.setrlimit(resource.RLIMIT_AS, (soft if hard < 0 else min(soft, hard), hard))


class Reviews(torch.utils.data.Dataset):
    """Stands in for tokenised reviews: positive ones use the first thousand words more."""

    def __init__(self, count: int) -> None:
        generator = torch.Generator().manual_seed(0)
        self.labels = torch.randint(2, (count,), generator=generator)
        self.tokens = torch.randint(1000, VOCAB, (count, SEQ), generator=generator)
        cue = torch.rand((count, SEQ), generator=generator) < 0.2
        self.tokens[cue & (self.labels[:, None] == 1)] %= 1000

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {
            "input_ids": self.tokens[index],
            "attention_mask": torch.ones(SEQ, dtype=torch.long),
            "labels": self.labels[index],
        }


def bert(layers: int, width: int, heads: int) -> BertForSequenceClassification:
    config = BertConfig(
        vocab_size=VOCAB,
        hidden_size=width,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        intermediate_size=4 * width,
        max_position_embeddings=SEQ,
        num_labels=2,
    )
    return BertForSequenceClassification(config)


class DistillationTrainer(Trainer):
    """Trains the student on its labels and on the teacher's softened predictions."""

    def __init__(self, *args, teacher: torch.nn.Module, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.teacher = teacher.eval()  # BUG: eval() leaves autograd on for the teacher

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        outputs = model(**inputs)
        teacher_logits = self.teacher(**inputs).logits  # BUG: not under torch.no_grad()
        soft = F.kl_div(
            F.log_softmax(outputs.logits / TEMPERATURE, dim=-1),
            F.softmax(teacher_logits / TEMPERATURE, dim=-1),
            reduction="batchmean",
        )
        loss = (1 - SOFT_WEIGHT) * outputs.loss + SOFT_WEIGHT * TEMPERATURE**2 * soft
        return (loss, outputs) if return_outputs else loss


def main() -> None:
    torch.manual_seed(0)
    teacher = bert(layers=6, width=384, heads=6)  # stands in for a fine-tuned teacher
    student = bert(layers=2, width=256, heads=4)
    arguments = TrainingArguments(
        output_dir=tempfile.mkdtemp(prefix="hf-distil-teacher-graph-"),
        per_device_train_batch_size=16,
        num_train_epochs=1,
        learning_rate=5e-4,
        logging_steps=4,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        dataloader_num_workers=0,
        disable_tqdm=True,
    )
    trainer = DistillationTrainer(
        model=student, args=arguments, train_dataset=Reviews(REVIEWS), teacher=teacher
    )
    torch.ones(1 << 20).sum()  # start the thread pool before the cap: its stacks count
    # oneDNN reports a failed allocation as "could not create a primitive"; the plain kernels
    # raise the allocator's own error, as on a GPU.
    torch.backends.mkldnn.enabled = False
    cap_address_space(BUDGET_BYTES)
    trainer.train()
    print("distillation finished")


if __name__ == "__main__":
    main()
