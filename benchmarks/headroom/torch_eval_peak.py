"""A PyTorch classifier over sequences that evaluates every 6 steps on a batch four times as
large, under a 128 MiB budget.

Usage: torch_eval_peak.py BATCH. Trains 12 steps with an evaluation after steps 6 and 12.
The evaluation keeps no graph, but its batch is four times the training batch and it holds
the full logits over a 2048-class vocabulary for every position: its peak is above the
training step's, so a size that trains five steps can run out in the first evaluation.
"""

from __future__ import annotations

import sys

import torch
from _cap import cap_address_space, steady_malloc
from torch import nn

BATCH = int(sys.argv[1])
BUDGET_MIB, STEPS, EVAL_EVERY = 128, 12, 6
SEQ, WIDTH, VOCAB = 32, 64, 2048


def evaluate(model: nn.Module) -> float:
    model.eval()
    with torch.no_grad():
        ids = torch.randint(0, VOCAB, (4 * BATCH, SEQ))
        logits = model(ids)
        probabilities = logits.softmax(-1)
        accuracy = (probabilities.argmax(-1) == ids).float().mean().item()
    model.train()
    return accuracy


def main() -> None:
    steady_malloc()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Embedding(VOCAB, WIDTH),
        nn.Linear(WIDTH, WIDTH),
        nn.GELU(),
        nn.Linear(WIDTH, VOCAB),
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    cap_address_space(BUDGET_MIB)
    for step in range(1, STEPS + 1):
        ids = torch.randint(0, VOCAB, (BATCH, SEQ))
        logits = model(ids)
        loss = nn.functional.cross_entropy(logits.reshape(-1, VOCAB), ids.reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        print(f"step {step}", flush=True)
        if step % EVAL_EVERY == 0:
            print(f"eval {evaluate(model):.3f}", flush=True)
    print("done", flush=True)


if __name__ == "__main__":
    main()
