"""Train sentence embeddings for a support-ticket search with the Hugging Face Trainer and
a contrastive loss whose queue of negatives is carried from step to step with its graph,
kept alive with `retain_graph=True`.

The encoder is a small BERT built from its config (2 layers of 128, an 8000-word
vocabulary, 1.3 million weights). The loss is SimCSE with a MoCo-style queue: each ticket
is encoded twice with different dropout, the two views are positives, and the 4096
embeddings of earlier steps in a queue are extra negatives. The queue is refreshed as
`torch.cat([positives, queue])[:4096]` without `.detach()`, so from the second step on the
loss reaches into the previous step's graph, and backward fails with "Trying to backward
through the graph a second time". The author silenced that by overriding `training_step`
to call `accelerator.backward(loss, retain_graph=True)`: now no step's graph is ever
freed, each one linked to the next through the queue, and each holds the saved activations
of both views of a batch of 32 tickets of 32 tokens, a few dozen MiB. Memory grows by that
much a step and the run goes out of memory after a dozen or so of its 120 steps, though the
model and AdamW's state take under 20 MiB. (Detach the positives before they go into the
queue and call backward without retain_graph: each step's graph is freed after its
backward and it trains under the same cap.)
"""

from __future__ import annotations

import resource
import tempfile

import torch
import torch.nn.functional as F
from transformers import BertConfig, BertModel, Trainer, TrainingArguments

BUDGET_BYTES = 1024 << 20  # as on a machine with 1 GiB to spare
VOCAB, SEQ, TICKETS, BATCH, QUEUE, TEMPERATURE = 8000, 32, 3840, 32, 4096, 0.05


def cap_address_space(budget_bytes: int) -> None:
    """Allow this process `budget_bytes` more address space, so it fails in seconds."""
    with open("/proc/self/statm") as statm:
        mapped = int(statm.read().split()[0]) * resource.getpagesize()
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    soft = mapped + budget_bytes
    resource.setrlimit(resource.RLIMIT_AS, (soft if hard < 0 else min(soft, hard), hard))


class Tickets(torch.utils.data.Dataset):
    """Stands in for tokenised support tickets: tickets on one topic share a few words."""

    def __init__(self, count: int) -> None:
        generator = torch.Generator().manual_seed(0)
        topics = torch.randint(200, (count,), generator=generator)
        self.tokens = torch.randint(1000, VOCAB, (count, SEQ), generator=generator)
        self.tokens[:, 1:6] = 200 + 5 * topics[:, None] % 800 + torch.arange(5)
        self.tokens[:, 0] = 101  # [CLS]

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {
            "input_ids": self.tokens[index],
            "attention_mask": torch.ones(SEQ, dtype=torch.long),
        }


class QueueContrastiveTrainer(Trainer):
    """SimCSE with a queue of earlier embeddings as extra negatives."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        hidden = self.model.config.hidden_size
        self.queue = F.normalize(torch.randn(QUEUE, hidden), dim=-1)

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        tokens = torch.cat([inputs["input_ids"], inputs["input_ids"]])
        mask = torch.cat([inputs["attention_mask"], inputs["attention_mask"]])
        pooled = model(input_ids=tokens, attention_mask=mask).last_hidden_state[:, 0]
        anchors, positives = F.normalize(pooled, dim=-1).chunk(2)
        candidates = torch.cat([positives, self.queue])
        logits = anchors @ candidates.T / TEMPERATURE
        loss = F.cross_entropy(logits, torch.arange(len(anchors)))
        # BUG: the queue keeps the positives' graph, linking this step to the next
        self.queue = torch.cat([positives, self.queue])[:QUEUE]
        return (loss, pooled) if return_outputs else loss

    def training_step(self, model, inputs, num_items_in_batch=None):
        model.train()
        loss = self.compute_loss(model, inputs)
        # added to silence "Trying to backward through the graph a second time"
        self.accelerator.backward(loss, retain_graph=True)
        if self.state.global_step % 5 == 0:
            print(f"step {self.state.global_step}: loss {loss.item():.3f}", flush=True)
        return loss.detach()


def main() -> None:
    torch.manual_seed(0)
    torch.ones(1 << 20).sum()  # start the thread pool before the cap: its stacks count
    # oneDNN reports a failed allocation as "could not create a primitive"; the plain kernels
    # raise the allocator's own error, as on a GPU.
    torch.backends.mkldnn.enabled = False
    cap_address_space(BUDGET_BYTES)
    config = BertConfig(
        vocab_size=VOCAB,
        hidden_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=512,
        max_position_embeddings=128,
    )
    model = BertModel(config, add_pooling_layer=False)
    weights = sum(p.numel() for p in model.parameters())
    print(f"{weights / 1e6:.1f}M weights", flush=True)
    arguments = TrainingArguments(
        output_dir=tempfile.mkdtemp(prefix="hf-simcse-queue-"),
        per_device_train_batch_size=BATCH,
        num_train_epochs=1,
        learning_rate=5e-5,
        logging_steps=10,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        dataloader_num_workers=0,
        disable_tqdm=True,
        remove_unused_columns=False,
    )
    trainer = QueueContrastiveTrainer(model=model, args=arguments, train_dataset=Tickets(TICKETS))
    trainer.train()
    print("training finished")


if __name__ == "__main__":
    main()
