"""Hold this process to a memory budget with an address-space cap (RLIMIT_AS), as a small
GPU would: the program then fails in seconds instead of swapping the machine."""

from __future__ import annotations

import ctypes
import ctypes.util
import resource

_M_ARENA_MAX = -8
_M_MMAP_THRESHOLD = -3


def steady_malloc(threshold_bytes: int = 1 << 20) -> None:
    """Make address space follow live memory, as a GPU caching allocator's pool follows its
    tensors: every large block gets its own mapping, returned at free (glibc's threshold
    otherwise moves with the program's history), and all threads share one arena (each new
    arena otherwise reserves 64 MiB of address space, at the whim of thread timing)."""
    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    libc.mallopt(_M_MMAP_THRESHOLD, threshold_bytes)
    libc.mallopt(_M_ARENA_MAX, 1)


def cap_address_space(budget_bytes: int) -> int:
    """Allow `budget_bytes` more address space than is mapped now; return the cap."""
    with open("/proc/self/statm") as statm:
        mapped_bytes = int(statm.read().split()[0]) * resource.getpagesize()
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    cap = mapped_bytes + budget_bytes
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    return cap
