"""Hold this process to a memory budget with an address-space cap (RLIMIT_AS), as a small
GPU would: the program then fails in seconds instead of swapping the machine."""

from __future__ import annotations

import ctypes
import ctypes.util
import resource

_M_MMAP_THRESHOLD = -3


def fixed_mmap_threshold(threshold_bytes: int = 1 << 20) -> None:
    """Serve every large block with its own mapping, returned at free (glibc's threshold
    otherwise moves with the program's history): address space then follows live memory,
    as a GPU caching allocator's pool follows its tensors, not the order of past frees."""
    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    libc.mallopt(_M_MMAP_THRESHOLD, threshold_bytes)


def cap_address_space(budget_bytes: int) -> int:
    """Allow `budget_bytes` more address space than is mapped now; return the cap."""
    with open("/proc/self/statm") as statm:
        mapped_bytes = int(statm.read().split()[0]) * resource.getpagesize()
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    cap = mapped_bytes + budget_bytes
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    return cap
