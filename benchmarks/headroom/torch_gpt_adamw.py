"""A small GPT-style language model (two decoder blocks, causal attention) trained with AdamW,
under a 240 MiB budget.

Usage: torch_gpt_adamw.py BATCH. Trains 12 steps on sequences of 128 tokens. AdamW's two
state tensors per weight appear at the first optimizer step, so the peak of the second
step is higher than the first's.
"""

from __future__ import annotations

import sys

import torch
from _cap import cap_address_space, steady_malloc
from torch import nn

BATCH = int(sys.argv[1])
BUDGET_MIB, STEPS = 240, 12
VOCAB, SEQ, WIDTH, HEADS, LAYERS = 4096, 128, 128, 4, 2


class Gpt(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.tokens = nn.Embedding(VOCAB, WIDTH)
        self.positions = nn.Embedding(SEQ, WIDTH)
        layer = nn.TransformerEncoderLayer(
            WIDTH, HEADS, 4 * WIDTH, dropout=0.0, batch_first=True, norm_first=True
        )
        self.blocks = nn.TransformerEncoder(layer, LAYERS, enable_nested_tensor=False)
        self.head = nn.Linear(WIDTH, VOCAB)
        self.mask = nn.Transformer.generate_square_subsequent_mask(SEQ)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.tokens(ids) + self.positions(torch.arange(ids.shape[1]))
        return self.head(self.blocks(x, mask=self.mask, is_causal=True))


def main() -> None:
    steady_malloc()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = Gpt()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
    model(torch.randint(0, VOCAB, (1, SEQ))).sum().backward()  # warm the kernels
    model.zero_grad(set_to_none=True)
    cap_address_space(BUDGET_MIB)
    for step in range(1, STEPS + 1):
        ids = torch.randint(0, VOCAB, (BATCH, SEQ + 1))
        logits = model(ids[:, :-1])
        loss = nn.functional.cross_entropy(logits.reshape(-1, VOCAB), ids[:, 1:].reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        print(f"step {step}", flush=True)
    print("done", flush=True)


if __name__ == "__main__":
    main()
