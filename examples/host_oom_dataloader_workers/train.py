"""Train with a DataLoader whose dataset loads all its images lazily, in every worker.

The bug: `ImageFolder.__getitem__` loads the whole dataset into memory on first use, a common
way to avoid pickling a large array into the workers. But each DataLoader worker is a separate
process with its own copy of the dataset object, so each loads its own full copy: host memory
is (workers x dataset), and the kernel's OOM killer kills a worker ("DataLoader worker (pid N)
is killed by signal: Killed"). Load once before the DataLoader starts (the workers then share
the pages), memory-map a file, or load per sample.

The script runs as if inside a container with 768 MiB of memory: as root it puts itself in a
small memory cgroup (cgroup v1 or v2), where the kernel kills a worker for real; elsewhere
it caps each process's address space (RLIMIT_AS), and a worker fails with an allocation
error instead.
"""

from __future__ import annotations

import atexit
import os
import resource
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset

CONTAINER_BYTES = 768 << 20
IMAGE_SHAPE = (3, 64, 64)
IMAGES = 4096  # 4096 x 48 KiB = 192 MiB decoded: it fits once, not four times
WORKERS = 4
EPOCHS = 3


class ImageFolder(Dataset[tuple[torch.Tensor, int]]):
    def __init__(self, count: int) -> None:
        self.count = count
        self.images: torch.Tensor | None = None  # loaded on first use, not pickled to workers

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        if self.images is None:  # BUG: runs once in every worker: one full copy per worker
            self.images = load_images(self.count)
        return self.images[index], index % 10


def load_images(count: int) -> torch.Tensor:
    """Stands in for reading and decoding a folder of JPEGs."""
    return torch.rand(count, *IMAGE_SHAPE)


def main() -> None:
    how = run_as_in_a_container(CONTAINER_BYTES, processes=1 + WORKERS)
    print(f"memory limited to {CONTAINER_BYTES >> 20} MiB ({how})", flush=True)
    loader = DataLoader(ImageFolder(IMAGES), batch_size=64, shuffle=True, num_workers=WORKERS)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, stride=4), nn.ReLU(), nn.Flatten(), nn.LazyLinear(10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for epoch in range(1, EPOCHS + 1):
        for images, labels in loader:
            loss = F.cross_entropy(model(images), labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        print(f"epoch {epoch}: loss {loss.item():.3f}", flush=True)


# -- running as if in a small container ------------------------------------------------------


def run_as_in_a_container(limit_bytes: int, processes: int) -> str:
    """Limit this process and the workers it starts to `limit_bytes` in all."""
    try:
        return _join_memory_cgroup(limit_bytes)
    except OSError:
        # Without a cgroup, the limit is per process: share it out.
        with open("/proc/self/statm") as statm:
            mapped_bytes = int(statm.read().split()[0]) * resource.getpagesize()
        _, hard = resource.getrlimit(resource.RLIMIT_AS)
        soft = mapped_bytes + limit_bytes // processes
        resource.setrlimit(resource.RLIMIT_AS, (soft if hard < 0 else min(soft, hard), hard))
        return f"RLIMIT_AS, {limit_bytes // processes >> 20} MiB per process"


def _join_memory_cgroup(limit_bytes: int) -> str:
    """Create a child of this process's memory cgroup with the limit, and move in."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):  # cgroup v1
            parent = Path("/sys/fs/cgroup/memory") / path.lstrip("/")
            files = {"memory.limit_in_bytes": limit_bytes, "memory.swappiness": 0}
            break
        if controllers == "":  # cgroup v2
            parent = Path("/sys/fs/cgroup") / path.lstrip("/")
            files = {"memory.max": limit_bytes, "memory.swap.max": 0}
    else:
        raise OSError("no memory cgroup")
    child = parent / f"example-{os.getpid()}"
    child.mkdir()
    atexit.register(_leave_cgroup, parent, child)
    for name, value in files.items():
        if (child / name).exists():
            (child / name).write_text(str(value))
    (child / "cgroup.procs").write_text(str(os.getpid()))
    return f"memory cgroup {child}"


def _leave_cgroup(parent: Path, child: Path) -> None:
    """Move this process and its exiting workers back, and remove the cgroup."""
    try:
        for pid in [str(os.getpid()), *(child / "cgroup.procs").read_text().split()]:
            with open(parent / "cgroup.procs", "w") as procs:
                procs.write(pid)
        child.rmdir()
    except OSError:
        pass


if __name__ == "__main__":
    main()
