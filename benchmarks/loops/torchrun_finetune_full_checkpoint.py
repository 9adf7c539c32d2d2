"""Fine-tune a sentiment head on a pre-trained text encoder on two ranks (torchrun, gloo,
CPU), each rank loading the whole pre-training checkpoint to take the encoder's weights.

The encoder (an embedding table of 250,000 words x 128 and a mixing layer: 122 MiB of
weights) was pre-trained with AdamW, and its checkpoint holds the weights and the
optimizer's two moments for every weight, 366 MiB. Fine-tuning freezes the encoder and
trains a small head on top, which needs little more than the encoder's weights. But each
rank builds the encoder and then `torch.load`s the whole checkpoint (map_location="cpu"),
moments included, to read its "encoder" entry: for that moment a rank holds its own
weights and three more copies, about 490 MiB, more than the memory there is, and both ranks
run out inside `torch.load`, before the first step. (Save the encoder's weights alone for
fine-tuning: the model and one loaded copy fit under the same cap, and the head, the only
part DDP wraps, then trains.)

Rank 0 first writes the checkpoint, with one real AdamW step, before the memory cap: it
stands in for the file that the pre-training run left on a bigger machine.
"""

from __future__ import annotations

import os
import resource
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel

BUDGET_BYTES = 384 << 20  # per rank: as on a machine with 768 MiB to spare for two ranks
VOCAB, DIM, WORDS, CLASSES, BATCH, STEPS = 250_000, 128, 48, 2, 64, 100


def cap_address_space(budget_bytes: int) -> None:
    """Allow this process `budget_bytes` more address space, so it fails in seconds."""
    with open("/proc/self/statm") as statm:
        mapped = int(statm.read().split()[0]) * resource.getpagesize()
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    soft = mapped + budget_bytes
    resource.setrlimit(resource.RLIMIT_AS, (soft if hard < 0 else min(soft, hard), hard))


class Encoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.EmbeddingBag(VOCAB, DIM, mode="mean")
        self.mix = nn.Linear(DIM, DIM)

    def forward(self, words: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.mix(self.embed(words)))


def write_pretraining_checkpoint(path: Path) -> None:
    """What the pre-training run saved: the encoder, AdamW's state and its step count."""
    encoder = Encoder()
    optimizer = torch.optim.AdamW(encoder.parameters(), lr=1e-3)
    words = torch.randint(VOCAB, (BATCH, WORDS))
    encoder(words).square().mean().backward()
    optimizer.step()
    state = {"encoder": encoder.state_dict(), "optimizer": optimizer.state_dict(), "step": 1}
    torch.save(state, path)


def make_batch(generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Stands in for tokenised reviews: positive ones use more of the first words."""
    labels = torch.randint(CLASSES, (BATCH,), generator=generator)
    words = torch.randint(VOCAB, (BATCH, WORDS), generator=generator)
    words[:, : WORDS // 4] %= torch.where(labels == 1, 1000, VOCAB)[:, None]
    return words, labels


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    torch.ones(1 << 20).sum()  # start the thread pool before the cap: its stacks count
    run = os.environ.get("TORCHELASTIC_RUN_ID", "local")
    path = Path(tempfile.gettempdir()) / f"pretrained-encoder-{run}.pt"
    if rank == 0:
        write_pretraining_checkpoint(path)
    dist.barrier()
    # oneDNN reports a failed allocation as "could not create a primitive"; the plain kernels
    # raise the allocator's own error, as on a GPU.
    torch.backends.mkldnn.enabled = False
    cap_address_space(BUDGET_BYTES)
    try:
        encoder = Encoder()
        # BUG: reads AdamW's moments too, three copies of the encoder, to take one
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
        encoder.load_state_dict(checkpoint["encoder"])
        del checkpoint
    finally:
        dist.barrier()
        if rank == 0:
            path.unlink()
    encoder.requires_grad_(False)  # frozen, the same on every rank: only the head is wrapped
    head = DistributedDataParallel(
        nn.Sequential(nn.Linear(DIM, 64), nn.ReLU(), nn.Linear(64, CLASSES))
    )
    optimizer = torch.optim.AdamW(head.parameters(), lr=1e-3)
    generator = torch.Generator().manual_seed(1 + rank)
    running = 0.0
    for step in range(1, STEPS + 1):
        words, labels = make_batch(generator)
        with torch.no_grad():
            features = encoder(words)
        loss = F.cross_entropy(head(features), labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        running += loss.item()
        if rank == 0 and step % 25 == 0:
            print(f"step {step}: mean loss {running / 25:.3f}", flush=True)
            running = 0.0
    dist.destroy_process_group()
    if rank == 0:
        print("fine-tuning finished")


if __name__ == "__main__":
    main()
