"""Build a model directly on the device when its weights alone are larger than the device.

The bug is a sizing one: a configuration made for several GPUs (or for bf16 weights) is
built in float32 on one. Building on the device (`with torch.device("cuda"):`) is the fast,
modern way to initialise a large model, so the error comes from a layer's constructor,
before the first batch.
"""

from __future__ import annotations

import resource
from dataclasses import dataclass

import torch
from torch import nn

HOST_BUDGET_BYTES = 768 << 20  # on CPU: run as if on a machine with 768 MiB to spare


@dataclass(frozen=True)
class Config:
    width: int
    layers: int


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.up = nn.Linear(width, 4 * width)
        self.down = nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.relu(self.up(x)))


class Model(nn.Module):
    def __init__(self, config: Config) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block(config.width) for _ in range(config.layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x


def limit_host_memory(budget_bytes: int) -> int:
    """Let this process map only `budget_bytes` more, as on a small machine: it then fails
    in seconds instead of pushing a shared host into swap."""
    with open("/proc/self/statm") as statm:
        mapped_bytes = int(statm.read().split()[0]) * resource.getpagesize()
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    soft = mapped_bytes + budget_bytes
    resource.setrlimit(resource.RLIMIT_AS, (soft if hard < 0 else min(soft, hard), hard))
    return budget_bytes


def memory_to_fill(device: torch.device) -> int:
    """The GPU's memory; on CPU, a budget this process is then held to."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    torch.ones(1 << 20).sum()  # start the CPU thread pool first: its stacks count as memory too
    return limit_host_memory(HOST_BUDGET_BYTES)


def main() -> None:
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    memory = memory_to_fill(device)
    width = 8192 if device.type == "cuda" else 512
    block_bytes = 8 * width * width * 4  # two float32 matrices of width x 4*width
    # A configuration whose float32 weights are 1.5x the memory there is.
    config = Config(width=width, layers=int(1.5 * memory) // block_bytes)
    print(
        f"building {config.layers} blocks ({config.layers * block_bytes / 2**30:.1f} GiB)",
        flush=True,
    )
    with torch.device(device):
        model = Model(config)  # fails in a layer's constructor, before any batch
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    inputs = torch.randn(8, width, device=device)
    loss = model(inputs).square().mean()
    loss.backward()
    optimizer.step()


if __name__ == "__main__":
    main()
