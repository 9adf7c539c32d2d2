"""Pick the batch of an ECG arrhythmia classifier with a hand-written probe that doubles the
batch until a forward pass runs out, under `torch.no_grad()`, and then train at the size it
found.

The model is a 1D convolutional net over 5-second, 12-lead recordings at 500 Hz (2500
samples): eight blocks of a 32-filter convolution, batch normalisation and ReLU at full
resolution, then pooling and a classifier over 5 rhythm classes. Each block's output is
32 x 2500 floats, 312 KiB a recording. To save time the probe runs only the forward pass,
and under `torch.no_grad()` (it "does not need gradients"): then each block's input is
freed as soon as its output exists, and a batch needs about 0.6 MiB a recording. It catches
the out-of-memory error at 512 and keeps 256. But a training step keeps what backward will
need from all eight blocks (each convolution's input, unfolded on the CPU, its output and
the activations), about 6 MiB a recording, 1.5 GiB at 256, four times the memory there
is, and the first training step at the size the probe chose runs out. (Probe with a whole
training step, forward, backward and optimizer step, as accelerate's
find_executable_batch_size would run it: it then settles on 32, which trains under the
same cap.)
"""

from __future__ import annotations

import ctypes
import resource

import torch
import torch.nn.functional as F
from torch import nn

BUDGET_BYTES = 384 << 20  # as on a machine with 384 MiB to spare
LEADS, SAMPLES, RHYTHMS, BLOCKS, WIDTH, STEPS = 12, 2500, 5, 8, 32, 100


def cap_address_space(budget_bytes: int) -> None:
    """Allow this process `budget_bytes` more address space, so it fails in seconds."""
    with open("/proc/self/statm") as statm:
        mapped = int(statm.read().split()[0]) * resource.getpagesize()
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    soft = mapped + budget_bytes
    resource.setrlimit(resource.RLIMIT_AS, (soft if hard < 0 else min(soft, hard), hard))


def make_recordings(count: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Stands in for ECG recordings: each rhythm beats at its own rate."""
    rhythms = torch.randint(RHYTHMS, (count,), generator=generator)
    time = torch.arange(SAMPLES) / 500.0
    rate = 1.0 + 0.4 * rhythms[:, None, None]  # beats a second
    lead_gain = torch.linspace(0.5, 1.5, LEADS)[None, :, None]
    beats = torch.sin(2 * torch.pi * rate * time).clamp(min=0) ** 8 * lead_gain
    return beats + 0.1 * torch.randn((count, LEADS, SAMPLES), generator=generator), rhythms


def make_model() -> nn.Module:
    layers: list[nn.Module] = []
    channels = LEADS
    for _ in range(BLOCKS):
        layers += [nn.Conv1d(channels, WIDTH, 3, padding=1), nn.BatchNorm1d(WIDTH), nn.ReLU()]
        channels = WIDTH
    layers += [nn.AdaptiveAvgPool1d(1), nn.Flatten(), nn.Linear(WIDTH, RHYTHMS)]
    return nn.Sequential(*layers)


def is_out_of_memory(error: RuntimeError) -> bool:
    return "out of memory" in str(error) or "can't allocate memory" in str(error)


def largest_batch_that_fits(model: nn.Module, start: int = 32, limit: int = 4096) -> int:
    """Double the batch until a forward pass runs out; return the last size that ran."""
    generator = torch.Generator().manual_seed(0)
    size, best = start, 0
    with torch.no_grad():  # BUG: probes a forward pass without autograd's saved activations
        while size <= limit:
            try:
                recordings, _ = make_recordings(size, generator)
                model(recordings)
            except RuntimeError as error:
                if not is_out_of_memory(error):
                    raise
                print(f"probe: batch {size} ran out", flush=True)
                break
            print(f"probe: batch {size} fits", flush=True)
            best, size = size, 2 * size
    return best


def main() -> None:
    # Allocations of 128 KiB and more get their own mappings, returned when freed, as a
    # device's caching allocator keeps large blocks apart from small ones: otherwise each
    # small tensor kept on glibc's heap can pin a megabyte of freed activations around it.
    ctypes.CDLL("libc.so.6").mallopt(-3, 128 << 10)  # M_MMAP_THRESHOLD
    torch.manual_seed(0)
    torch.set_num_threads(2)
    torch.ones(1 << 20).sum()  # start the thread pool before the cap: its stacks count
    # oneDNN reports a failed allocation as "could not create a primitive"; the plain kernels
    # raise the allocator's own error, as on a GPU.
    torch.backends.mkldnn.enabled = False
    cap_address_space(BUDGET_BYTES)
    model = make_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    batch = largest_batch_that_fits(model)
    print(f"training at batch {batch}", flush=True)
    generator = torch.Generator().manual_seed(1)
    for step in range(1, STEPS + 1):
        recordings, rhythms = make_recordings(batch, generator)
        loss = F.cross_entropy(model(recordings), rhythms)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if step % 10 == 0:
            print(f"step {step}: loss {loss.item():.3f}", flush=True)
    print("training finished")


if __name__ == "__main__":
    main()
