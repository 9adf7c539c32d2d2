"""Hold a benchmark program to a memory budget with an address-space cap (RLIMIT_AS), as a
small GPU would, so that a batch too large fails in seconds instead of swapping."""

from __future__ import annotations

import ctypes
import ctypes.util
import resource

_M_ARENA_MAX = -8
_M_MMAP_THRESHOLD = -3


def steady_malloc(threshold_bytes: int = 1 << 20) -> None:
    """Large blocks get a mapping of their own, returned at free, and all threads share one
    arena: address space then follows live memory, as a GPU caching allocator's pool follows
    its tensors, and the same batch size fails or trains the same way in every run."""
    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    libc.mallopt(_M_MMAP_THRESHOLD, threshold_bytes)
    libc.mallopt(_M_ARENA_MAX, 1)


def cap_address_space(budget_mib: int) -> None:
    """Allow this process `budget_mib` MiB more address space than it has mapped now."""
    with open("/proc/self/statm") as statm:
        mapped = int(statm.read().split()[0]) * resource.getpagesize()
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    soft = mapped + (budget_mib << 20)
    resource.setrlimit(resource.RLIMIT_AS, (soft if hard < 0 else min(soft, hard), hard))
