"""Train a small language model and keep every step's logits for the epoch's accuracy.

The bug is one line: `epoch_logits.append(logits)` keeps each step's logits (and the autograd
graph behind them) alive, so memory grows by one batch of logits per step until it runs out.
"""

from __future__ import annotations

import resource

import torch
import torch.nn.functional as F
from torch import nn

HOST_BUDGET_BYTES = 768 << 20  # on CPU: run as if on a machine with 768 MiB to spare
MAX_STEPS = 200


class TinyLanguageModel(nn.Module):
    def __init__(self, vocab_size: int, hidden: int = 64) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab_size, hidden)
        self.mlp = nn.Sequential(nn.Linear(hidden, hidden), nn.GELU())
        self.head = nn.Linear(hidden, vocab_size)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.mlp(self.embed(tokens)))


def limit_host_memory(budget_bytes: int) -> int:
    """Allow this process `budget_bytes` more address space, so that it fails in seconds
    instead of swapping the machine to a halt."""
    with open("/proc/self/statm") as statm:
        mapped_bytes = int(statm.read().split()[0]) * resource.getpagesize()
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(resource.RLIMIT_AS, (mapped_bytes + budget_bytes, hard))
    return budget_bytes


def memory_to_fill(device: torch.device) -> int:
    """The GPU's memory; on CPU, a budget this process is then held to."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    torch.ones(1 << 20).sum()  # start the CPU thread pool first: its stacks count as memory too
    return limit_host_memory(HOST_BUDGET_BYTES)


def main() -> None:
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    # One batch of float32 logits is 1/48 of the memory: the leak fills it in ~40 steps.
    vocab_size = 4096
    tokens_per_batch = memory_to_fill(device) // 48 // (vocab_size * 4)
    seq_len = 64
    batch_size = max(1, tokens_per_batch // seq_len)

    model = TinyLanguageModel(vocab_size).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    epoch_logits: list[torch.Tensor] = []
    epoch_targets: list[torch.Tensor] = []

    for step in range(1, MAX_STEPS + 1):
        tokens = torch.randint(vocab_size, (batch_size, seq_len + 1), device=device)
        inputs, targets = tokens[:, :-1], tokens[:, 1:]
        logits = model(inputs)
        loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

        epoch_logits.append(logits)  # BUG: keeps every step's logits (use a running count)
        epoch_targets.append(targets)
        if step % 10 == 0:
            print(f"step {step}: loss {loss.item():.3f}", flush=True)

    predictions = torch.cat(epoch_logits).argmax(dim=-1)
    accuracy = (predictions == torch.cat(epoch_targets)).float().mean().item()
    print(f"epoch accuracy: {accuracy:.3f}")


if __name__ == "__main__":
    main()
