"""Find the largest batch for a small image classifier with a hand-written finder that
halves the batch on OOM, calling itself again from inside its `except` block.

`train_at(batch_size)` tries a few training steps at a size and, when one runs out of
memory, returns `train_at(batch_size // 2)` from the `except` clause. While Python handles
an exception it keeps the exception, and its traceback keeps every frame the error passed
through, with their local variables: the failed try's batch and the output of the last
layer that ran, whose graph holds every activation saved for backward. The first try, a
batch of 512 32x32 images, runs out in its third convolution with about 190 MiB in such
activations; the retry at 256 starts with all of that still alive and runs out at its
very first feature map, and so do 128, 64 and 32; at 32 the finder gives up and the error
ends the run, a few seconds in, though a batch of 128 fits by itself. (Leave
the `except` block before retrying, e.g. halve the batch after it in a loop, so the
failed try's frames are freed: the finder then settles on 128 and trains under the same
cap.)
"""

from __future__ import annotations

import resource

import torch
import torch.nn.functional as F
from torch import nn

BUDGET_BYTES = 320 << 20  # as on a machine with 320 MiB to spare
SIDE, CLASSES, IMAGES, TRIAL_STEPS = 32, 10, 2048, 3
FIRST_BATCH, SMALLEST_BATCH = 512, 32


def cap_address_space(budget_bytes: int) -> None:
    """Allow this process `budget_bytes` more address space, so it fails in seconds."""
    with open("/proc/self/statm") as statm:
        mapped = int(statm.read().split()[0]) * resource.getpagesize()
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    soft = mapped + budget_bytes
    resource.setrlimit(resource.RLIMIT_AS, (soft if hard < 0 else min(soft, hard), hard))


def make_images(count: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Stands in for small photos: each class brightens its own horizontal band."""
    generator = torch.Generator().manual_seed(0)
    labels = torch.randint(CLASSES, (count,), generator=generator)
    images = torch.rand((count, 3, SIDE, SIDE), generator=generator) * 0.5
    band = SIDE // CLASSES
    for label in range(CLASSES):
        images[labels == label, :, label * band : (label + 1) * band] += 0.5
    return images, labels


def make_model() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(32, 32, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(64, 64, 3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(64, CLASSES),
    )


def is_out_of_memory(error: BaseException) -> bool:
    return isinstance(error, RuntimeError) and "can't allocate memory" in str(error)


def main() -> None:
    torch.manual_seed(0)
    torch.ones(1 << 20).sum()  # start the thread pool before the cap: its stacks count
    # oneDNN reports a failed allocation as "could not create a primitive"; the plain kernels
    # raise the allocator's own error, as on a GPU.
    torch.backends.mkldnn.enabled = False
    cap_address_space(BUDGET_BYTES)
    images, labels = make_images(IMAGES)
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

    def steps(batch_size: int, count: int) -> float:
        loss = torch.zeros(())
        for step in range(count):
            start = (step * batch_size) % IMAGES
            batch = images[start : start + batch_size]
            logits = model(batch)
            loss = F.cross_entropy(logits, labels[start : start + batch_size])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
        return loss.item()

    def train_at(batch_size: int) -> int:
        try:
            steps(batch_size, TRIAL_STEPS)
            print(f"batch size {batch_size} fits", flush=True)
            return batch_size
        except RuntimeError as error:
            if not is_out_of_memory(error) or batch_size <= SMALLEST_BATCH:
                raise
            print(f"out of memory at batch size {batch_size}; halving", flush=True)
            return train_at(batch_size // 2)  # BUG: retried while `error` is being handled

    batch_size = train_at(FIRST_BATCH)
    for epoch in range(1):
        loss = steps(batch_size, IMAGES // batch_size)
        print(f"epoch {epoch}: batch size {batch_size}, last loss {loss:.3f}", flush=True)
    print("training finished")


if __name__ == "__main__":
    main()
