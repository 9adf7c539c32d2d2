"""A PyTorch transformer encoder layer trained with Adam, under a memory cap: attention's
activations grow with the batch, and a large embedding with its Adam state is a fixed term
that dominates small batches.

Usage: torch_attention.py BATCH [BUDGET_MIB] [STEPS].
"""

from __future__ import annotations

import sys

import torch
from host_cap import cap_address_space, steady_malloc
from torch import nn

BATCH = int(sys.argv[1])
BUDGET_MIB = int(sys.argv[2]) if len(sys.argv) > 2 else 400
STEPS = int(sys.argv[3]) if len(sys.argv) > 3 else 6
VOCAB, SEQ, WIDTH, HEADS = 50_000, 64, 128, 4


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)  # 25.6 MB, and twice that in Adam's state
        self.encoder = nn.TransformerEncoderLayer(
            WIDTH, HEADS, dim_feedforward=4 * WIDTH, batch_first=True
        )
        self.head = nn.Linear(WIDTH, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(self.embed(tokens))[:, -1])


def main() -> None:
    steady_malloc()
    torch.set_num_threads(1)
    torch.ones(1 << 20).sum()
    cap_address_space(BUDGET_MIB << 20)
    torch.manual_seed(0)
    model = Model()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    for step in range(1, STEPS + 1):
        tokens = torch.randint(VOCAB, (BATCH, SEQ))
        targets = torch.randint(VOCAB, (BATCH,))
        loss = nn.functional.cross_entropy(model(tokens), targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        print(f"step {step}", flush=True)
    print("done", flush=True)


if __name__ == "__main__":
    main()
