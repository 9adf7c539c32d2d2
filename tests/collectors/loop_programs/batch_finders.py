"""Out-of-memory errors the program survives: accelerate's batch-size finder, then a
hand-written loop that halves the batch. Every failure is PyTorch's CPU allocator refusing
a real request (a tensor of terabytes once the batch is above 20)."""

import gc

import torch
from accelerate.utils import find_executable_batch_size


def forward(batch_size: int) -> torch.Tensor:
    if batch_size > 20:  # the activations of a batch this size would not fit
        return torch.empty(batch_size << 40, dtype=torch.uint8)
    return torch.ones(batch_size, 4)


@find_executable_batch_size(starting_batch_size=64)
def train(batch_size: int) -> int:
    model = torch.nn.Linear(4, 4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(5):
        model(forward(batch_size)).sum().backward()
        optimizer.step()
        optimizer.zero_grad()
    return batch_size


print("accelerate trained at", train())

batch = 64
while True:
    try:
        forward(batch)
        break
    except RuntimeError:
        gc.collect()  # what an OOM handler does before it tries again
        batch //= 2
print("by hand at", batch)
